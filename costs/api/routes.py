"""The costs app's resources on the ``/api/v1/`` router (reports included)."""

from ..reports.api.routes import register_routes as register_report_routes
from .capacity import CapacityViewSet
from .utilization import BudgetStatusViewSet, UtilizationViewSet
from .views import CostViewSet, PriceViewSet


def register_routes(router) -> None:
    """Mount ``prices/``, ``costs/``, ``utilization/``, ``budget-status/``, ``capacity/`` and ``reports/`` on ``router``."""
    router.register("prices", PriceViewSet)
    router.register("costs", CostViewSet, basename="cost")
    router.register("utilization", UtilizationViewSet, basename="utilization")
    router.register("capacity", CapacityViewSet, basename="capacity")
    router.register("budget-status", BudgetStatusViewSet, basename="budget-status")
    register_report_routes(router)
