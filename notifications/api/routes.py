"""The notifications app's resources on the ``/api/v1/`` router."""

from .views import NotificationViewSet, SubscriptionViewSet


def register_routes(router) -> None:
    """Mount ``subscriptions/`` and ``notifications/`` on ``router``."""
    router.register("subscriptions", SubscriptionViewSet)
    router.register("notifications", NotificationViewSet)
