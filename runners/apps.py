from django.apps import AppConfig


class RunnersConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "runners"

    def ready(self):
        # Backends register themselves in runners.base on import.
        from .kubernetes import runner as kubernetes_runner  # noqa: F401
        from .local import runner  # noqa: F401
