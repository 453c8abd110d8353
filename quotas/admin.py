"""Django admin of tenancy and entitlement; changes to quotas, cohorts, team fair share and priority classes are audited."""

from django.contrib import admin
from django.db import transaction

from .models import (
    ApiToken,
    Budget,
    ChangeRequest,
    Cohort,
    Membership,
    OidcIdentity,
    PriorityClass,
    Quota,
    QuotaEvent,
    Team,
    audited_values,
)


class AuditedAdmin(admin.ModelAdmin):
    """Saves and deletes that write a QuotaEvent in the same transaction."""

    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            old = audited_values(type(obj).objects.get(pk=obj.pk)) if change else {}
            super().save_model(request, obj, form, change)
            QuotaEvent.record(request.user, obj, "updated" if change else "created", old, audited_values(obj))

    def delete_model(self, request, obj):
        with transaction.atomic():
            QuotaEvent.record(request.user, obj, "deleted", audited_values(obj), {})
            super().delete_model(request, obj)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ["slug", "name", "cost_center", "cohort", "weight", "created_at"]
    list_filter = ["cohort"]
    search_fields = ["slug", "name", "cost_center"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role"]
    list_filter = ["role", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "expires_at"]
    readonly_fields = ["prefix", "digest", "created_at", "last_used_at"]


@admin.register(Quota)
class QuotaAdmin(AuditedAdmin):
    """GPU quotas, and CPU quotas (rows of the CPU accelerator, in vCPUs); ``Quota.clean`` refuses numbers of the
    other unit."""

    list_display = ["team", "accelerator", "cluster", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus",
                    "max_gpus_per_job", "nominal_vcpus", "borrowing_limit_vcpus", "lending_limit_vcpus",
                    "max_vcpus_per_job"]
    list_filter = ["accelerator", "team"]
    fieldsets = [
        (None, {"fields": ["team", "accelerator", "cluster"]}),
        ("GPUs (GPU accelerators)", {"fields": ["nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus",
                                                "max_gpus_per_job"]}),
        ("vCPUs (the CPU accelerator)", {"fields": ["nominal_vcpus", "borrowing_limit_vcpus", "lending_limit_vcpus",
                                                    "max_vcpus_per_job"]}),
    ]


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ["team", "period", "amount_usd", "action", "alert_thresholds"]
    list_filter = ["action", "period"]


@admin.register(Cohort)
class CohortAdmin(AuditedAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = ["name", "value", "description"]


@admin.register(QuotaEvent)
class QuotaEventAdmin(admin.ModelAdmin):
    """The audit trail: read only."""

    list_display = ["created_at", "actor", "action", "object_type", "object_repr"]
    list_filter = ["object_type", "action"]
    readonly_fields = ["created_at", "actor", "action", "object_type", "object_id", "object_repr", "old", "new"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ChangeRequest)
class ChangeRequestAdmin(admin.ModelAdmin):
    """Team admins' quota and budget change requests: read only here (approve and decline from the Requests page,
    the API or cpctl, which apply the change and write its event; ADR 0029)."""

    list_display = ["id", "team", "kind", "target_id", "state", "requested_by", "created_at", "decided_by"]
    list_filter = ["state", "kind", "team"]
    readonly_fields = [f.name for f in ChangeRequest._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):
    """Single sign-on identities: read only (a sign-in writes them, ADR 0032); deleting one makes that subject's
    next sign-in create a new user."""

    list_display = ["user", "issuer", "subject", "signed_in_at"]
    search_fields = ["user__username", "subject"]
    readonly_fields = [f.name for f in OidcIdentity._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
