"""The reports resource on the ``/api/v1/`` router."""

from .views import ReportViewSet


def register_routes(router) -> None:
    """Mount ``reports/`` on ``router``."""
    router.register("reports", ReportViewSet)
