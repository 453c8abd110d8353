"""URL map: admin, the REST API (``/api/v1/``), its OpenAPI schema and docs, the health probes, the web UI.

Every app that has a REST API exposes ``<app>.api.routes.register_routes(router)``;
the router is built here, the only module that knows every app.
"""

from importlib import import_module

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from jobs.metrics import register_job_state_collector

from . import views

#: Apps whose ``api.routes`` mount resources under ``/api/v1/``, in order. Jobs first: URL resolution tries the
#: routes in order, and job submission is the hottest endpoint.
API_APPS = ("jobs", "quotas", "runners", "costs", "notifications", "serving")


def api_router() -> DefaultRouter:
    """The ``/api/v1/`` router with every app's resources registered (docs/design.md, Interfaces)."""
    router = DefaultRouter()
    for app in API_APPS:
        import_module(f"{app}.api.routes").register_routes(router)
    return router


register_job_state_collector()  # job states and queue depth, read at scrape time

# An uncaught database-unavailable error outside a view answers 503 too (core.middleware); others keep the 500.
handler500 = "core.middleware.handler503"
# A path under /api/ that matches no route answers JSON, like every other API answer.
handler404 = "core.middleware.handler404"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_router().urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    # --- Observability: /metrics (django-prometheus and the job state collector) ---
    path("", include("django_prometheus.urls")),
    # --- Frontend (web UI) -------------------------------------------------
    path("", include("frontend.urls")),
]
