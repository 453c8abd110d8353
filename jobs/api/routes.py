"""The jobs app's resources on the ``/api/v1/`` router."""

from .arrays import JobArrayViewSet
from .cohort_trees import CohortTreeViewSet
from .fairsharing import FairSharingViewSet
from .views import JobViewSet


def register_routes(router) -> None:
    """Mount ``jobs/`` (with ``cancel/``, ``logs/``, ``events/``, ``attempts/``), ``arrays/`` (with ``cancel/``,
    ``elements/``), ``cohort-trees/`` and ``fair-sharing/`` (list only) on ``router`` (a DRF router)."""
    router.register("jobs", JobViewSet)
    router.register("arrays", JobArrayViewSet)
    router.register("cohort-trees", CohortTreeViewSet, basename="cohort-tree")
    router.register("fair-sharing", FairSharingViewSet, basename="fair-sharing")
