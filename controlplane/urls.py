"""URL map: admin, the REST API (``/api/v1/``), its OpenAPI schema and docs, and the health probes.

The web UI's URLs go last, at the marked place, once the ``frontend`` app has them.
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from . import metrics, views
from .api import api_router

metrics.register_job_state_collector()  # job states and queue depth, read at scrape time

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_router().urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    # --- Observability: /metrics (django-prometheus and controlplane.metrics) ---
    path("", include("django_prometheus.urls")),
    # --- Frontend (web UI) -------------------------------------------------
    path("", include("frontend.urls")),
]
