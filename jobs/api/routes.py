"""The jobs app's resources on the ``/api/v1/`` router."""

from .arrays import JobArrayViewSet
from .views import JobViewSet


def register_routes(router) -> None:
    """Mount ``jobs/`` (with ``cancel/``, ``logs/``, ``events/``, ``attempts/``) and ``arrays/`` (with ``cancel/``,
    ``elements/``) on ``router`` (a DRF router)."""
    router.register("jobs", JobViewSet)
    router.register("arrays", JobArrayViewSet)
