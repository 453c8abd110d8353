"""The costs app's resources on the ``/api/v1/`` router."""

from .utilization import BudgetStatusViewSet, UtilizationViewSet
from .views import CostViewSet, PriceViewSet


def register_routes(router) -> None:
    """Mount ``prices/``, ``costs/``, ``utilization/`` and ``budget-status/`` on ``router``."""
    router.register("prices", PriceViewSet)
    router.register("costs", CostViewSet, basename="cost")
    router.register("utilization", UtilizationViewSet, basename="utilization")
    router.register("budget-status", BudgetStatusViewSet, basename="budget-status")
