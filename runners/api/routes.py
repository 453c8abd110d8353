"""The runners app's resources on the ``/api/v1/`` router."""

from .views import AcceleratorViewSet, ClusterViewSet, NodePoolViewSet, NodeViewSet


def register_routes(router) -> None:
    """Mount ``accelerators/``, ``clusters/``, ``node-pools/`` and ``nodes/`` on ``router``."""
    router.register("accelerators", AcceleratorViewSet)
    router.register("clusters", ClusterViewSet)
    router.register("node-pools", NodePoolViewSet)
    router.register("nodes", NodeViewSet)
