"""The serving app's resources on the ``/api/v1/`` router."""

from .views import RolloutViewSet


def register_routes(router) -> None:
    """Mount ``jobs/<id>/rollout/`` (POST: start a rolling update of a serving job) on ``router`` (a DRF router)."""
    router.register(r"jobs", RolloutViewSet, basename="job-rollout")
