"""The quotas app's resources on the ``/api/v1/`` router."""

from .audit import AuditRecordViewSet
from .change_requests import ChangeRequestViewSet
from .views import BudgetViewSet, CohortQuotaViewSet, CohortViewSet, PriorityClassViewSet, QuotaViewSet, TeamViewSet


def register_routes(router) -> None:
    """Mount ``teams/``, ``quotas/``, ``budgets/``, ``cohorts/``, ``cohort-quotas/``, ``priority-classes/``,
    ``change-requests/`` and ``audit/`` on ``router``."""
    router.register("teams", TeamViewSet)
    router.register("quotas", QuotaViewSet)
    router.register("budgets", BudgetViewSet)
    router.register("cohorts", CohortViewSet)
    router.register("cohort-quotas", CohortQuotaViewSet)
    router.register("priority-classes", PriorityClassViewSet)
    router.register("change-requests", ChangeRequestViewSet)
    router.register("audit", AuditRecordViewSet)
