"""The quotas app's resources on the ``/api/v1/`` router."""

from .views import BudgetViewSet, CohortViewSet, PriorityClassViewSet, QuotaViewSet, TeamViewSet


def register_routes(router) -> None:
    """Mount ``teams/``, ``quotas/``, ``budgets/``, ``cohorts/`` and ``priority-classes/`` on ``router``."""
    router.register("teams", TeamViewSet)
    router.register("quotas", QuotaViewSet)
    router.register("budgets", BudgetViewSet)
    router.register("cohorts", CohortViewSet)
    router.register("priority-classes", PriorityClassViewSet)
