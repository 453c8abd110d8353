"""URLs of the web UI, mounted at the site root (``controlplane/urls.py``) under the ``frontend`` namespace."""

from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from . import array_pages, fleet_pages, notification_pages, queue_pages, sso, views

app_name = "frontend"

urlpatterns = [
    path("login/", sso.SignInView.as_view(), name="login"),
    path("oidc/authenticate/", sso.SsoStartView.as_view(), name="oidc-start"),
    path("oidc/callback/", sso.SsoCallbackView.as_view(), name="oidc-callback"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/rows/", views.job_rows, name="job-rows"),
    path("jobs/new/", views.job_submit, name="job-submit"),
    path("jobs/new/preview/", views.job_preview, name="job-preview"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/status/", views.job_status, name="job-status"),
    path("jobs/<int:pk>/logs/", views.job_logs, name="job-logs"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("arrays/<int:pk>/", array_pages.array_detail, name="array-detail"),
    path("arrays/<int:pk>/cancel/", array_pages.array_cancel, name="array-cancel"),
    path("queue/", queue_pages.queue, name="queue"),
    path("teams/", views.team_list, name="team-list"),
    path("cohorts/", views.cohort_tree, name="cohort-tree"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("teams/<slug:slug>/quotas/<int:pk>/edit/", views.quota_edit, name="quota-edit"),
    path("teams/<slug:slug>/budgets/new/", views.budget_edit, name="budget-new"),
    path("teams/<slug:slug>/budgets/<int:pk>/edit/", views.budget_edit, name="budget-edit"),
    path("teams/<slug:slug>/quotas/<int:pk>/request/", views.quota_request, name="quota-request"),
    path("teams/<slug:slug>/budgets/request/", views.budget_request, name="budget-request"),
    path("teams/<slug:slug>/budgets/<int:pk>/request/", views.budget_request, name="budget-request"),
    path("requests/", views.request_list, name="request-list"),
    path("notifications/", notification_pages.notification_list, name="notification-list"),
    path("notifications/<int:pk>/delete/", notification_pages.subscription_delete, name="subscription-delete"),
    path("requests/<int:pk>/<slug:action>/", views.request_action, name="request-action"),
    path("audit/", views.audit_list, name="audit-list"),
    path("clusters/", views.cluster_list, name="cluster-list"),
    path("nodes/", fleet_pages.nodes, name="node-list"),
    path("nodes/<int:pk>/<slug:action>/", views.node_action, name="node-action"),
    path("utilization/", fleet_pages.utilization, name="utilization"),
    path("costs/", views.costs, name="costs"),
    path("costs.csv", views.costs_csv, name="costs-csv"),
    path("capacity/", views.capacity, name="capacity"),
    path("reports/", views.report_list, name="report-list"),
    path("reports/<int:pk>/", views.report_detail, name="report-detail"),
    path("reports/<int:pk>.csv", views.report_csv, name="report-csv"),
    # Browsers ask for /favicon.ico whatever the page links; answer with the UI's icon.
    path("favicon.ico", RedirectView.as_view(url=static("frontend/favicon.svg"), permanent=True), name="favicon"),
]
