"""The jobs app's resources on the ``/api/v1/`` router."""

from .views import JobViewSet


def register_routes(router) -> None:
    """Mount ``jobs/`` (with ``cancel/``, ``logs/``, ``events/``, ``attempts/``) on ``router`` (a DRF router)."""
    router.register("jobs", JobViewSet)
