from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo's app: only its ``manage.py demo`` command; it has no models."""

    name = "demo"
