"""Django admin of tenancy and entitlement; every change of a governed object appends an audit record (ADR 0031)."""

from django import forms
from django.contrib import admin
from django.db import transaction

from .audit import deletion_snapshots, record, record_deletions, snapshot
from .models import (
    ApiToken,
    AuditRecord,
    Budget,
    ChangeRequest,
    Cohort,
    CohortQuota,
    Membership,
    OidcIdentity,
    PriorityClass,
    Quota,
    Team,
    lock_cohort_tree,
)


class ReasonAdminForm(forms.ModelForm):
    """An admin form with the change's reason, which the audit record keeps (not a field of the object)."""

    audit_reason = forms.CharField(required=False, label="Reason", max_length=2000,
                                   widget=forms.Textarea(attrs={"rows": 2}),
                                   help_text="Why you make this change: kept in the audit trail.")


class AuditedAdmin(admin.ModelAdmin):
    """Saves and deletes, of the object and of its inlines, that append an audit record (the staff user, the
    values before and after, the form's reason) in the admin's own transaction; bulk deletes one by one."""

    form = ReasonAdminForm

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if self.fieldsets:
            fieldsets = [*fieldsets, ("Audit", {"fields": ["audit_reason"]})]
        return fieldsets

    def save_model(self, request, obj, form, change):
        with transaction.atomic():
            before = snapshot(type(obj).objects.get(pk=obj.pk)) if change else {}
            super().save_model(request, obj, form, change)
            record(request.user, "updated" if change else "created", obj, before, snapshot(obj),
                   form.cleaned_data.get("audit_reason", ""))

    def delete_model(self, request, obj):
        with transaction.atomic():
            snapshots = deletion_snapshots(obj)
            super().delete_model(request, obj)
            record_deletions(request.user, obj, snapshots)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)

    def save_formset(self, request, form, formset, change):
        """Save an inline formset (memberships, node pools) and record each row created, changed or deleted."""
        with transaction.atomic():
            stored = {id(f.instance): f.instance.pk for f in formset.initial_forms if f.instance.pk}
            before = {pk: snapshot(formset.model.objects.get(pk=pk)) for pk in stored.values()}
            super().save_formset(request, form, formset, change)
            reason = form.cleaned_data.get("audit_reason", "")
            for obj in formset.new_objects:
                record(request.user, "created", obj, {}, snapshot(obj), reason)
            for obj, _ in formset.changed_objects:
                record(request.user, "updated", obj, before[obj.pk], snapshot(obj), reason)
            for obj in formset.deleted_objects:
                pk = stored[id(obj)]
                record(request.user, "deleted", obj, before[pk], {}, reason, object_id=pk)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class CohortTreeLockedAdmin(AuditedAdmin):
    """An admin whose saves and deletes (a cohort's parent, a team's cohort) take the cohort rows' lock
    (``lock_cohort_tree``) before the form is read and checked, as the API's writes do: two staff changing parents
    at once cannot together close a loop, and a team cannot move into a cohort being deleted."""

    def changeform_view(self, request, *args, **kwargs):
        return self._tree_locked(request, super().changeform_view, *args, **kwargs)

    def delete_view(self, request, *args, **kwargs):
        return self._tree_locked(request, super().delete_view, *args, **kwargs)

    @staticmethod
    def _tree_locked(request, view, *args, **kwargs):
        """``view(request, ...)``; a POST (a save or a delete) inside a transaction that holds the cohort rows."""
        if request.method != "POST":
            return view(request, *args, **kwargs)
        with transaction.atomic():
            lock_cohort_tree()
            return view(request, *args, **kwargs)


@admin.register(Team)
class TeamAdmin(CohortTreeLockedAdmin):
    list_display = ["slug", "name", "cost_center", "cohort", "weight", "created_at"]
    list_filter = ["cohort"]
    search_fields = ["slug", "name", "cost_center"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
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
class BudgetAdmin(AuditedAdmin):
    list_display = ["team", "period", "amount_usd", "action", "alert_thresholds"]
    list_filter = ["action", "period"]


class CohortQuotaInline(admin.TabularInline):
    """A cohort's own GPU quotas, one row per accelerator (ADR 0046)."""

    model = CohortQuota
    extra = 0


@admin.register(Cohort)
class CohortAdmin(CohortTreeLockedAdmin):
    """Cohorts nest (``parent``); ``Cohort.clean`` refuses a parent chain that loops (ADR 0046)."""

    list_display = ["name", "parent", "weight", "created_at"]
    list_filter = ["parent"]
    search_fields = ["name"]
    inlines = [CohortQuotaInline]


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedAdmin):
    list_display = ["name", "value", "description"]


@admin.register(AuditRecord)
class AuditRecordAdmin(admin.ModelAdmin):
    """The audit trail: read only (no add, change or delete; the table refuses them too)."""

    list_display = ["at", "actor_name", "action", "object_type", "object_repr", "team", "reason"]
    list_filter = ["object_type", "action"]
    search_fields = ["actor_name", "object_repr", "reason"]
    readonly_fields = ["at", "actor", "actor_name", "action", "object_type", "object_id", "object_repr", "team",
                       "before", "after", "reason"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
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
