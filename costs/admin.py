"""Django admin of prices and the cost ledger; a change of a price appends an audit record (ADR 0031)."""

from django.contrib import admin

from quotas.admin import AuditedAdmin

from .models import (
    BudgetAlert,
    ClusterMetrics,
    CostEntry,
    DailyCostRollup,
    ElectricityPrice,
    LedgerDiscrepancy,
    Price,
    Report,
    UnknownCostAlert,
    UtilizationRollup,
)


@admin.register(Price)
class PriceAdmin(AuditedAdmin):
    list_display = ["provider", "region", "accelerator", "capacity_type", "cluster", "usd_per_gpu_hour", "usd_per_vcpu_hour",
                    "usd_per_gib_hour", "effective_from"]
    list_filter = ["provider", "accelerator", "capacity_type"]


@admin.register(ElectricityPrice)
class ElectricityPriceAdmin(AuditedAdmin):
    list_display = ["provider", "region", "cluster", "usd_per_kwh", "effective_from", "source"]
    list_filter = ["provider"]


@admin.register(CostEntry)
class CostEntryAdmin(admin.ModelAdmin):
    """The ledger is append-only: entries are shown, never edited."""

    list_display = ["job", "attempt", "team", "cluster", "interval_start", "interval_end", "gpus", "usd_per_gpu_hour", "amount_usd"]
    list_filter = ["team", "cluster", "accelerator"]
    readonly_fields = [f.name for f in CostEntry._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(DailyCostRollup)
class DailyCostRollupAdmin(admin.ModelAdmin):
    """Derived from the ledger (``manage.py rebuild_rollups``): read only."""

    list_display = ["day", "team", "cluster", "accelerator", "gpu_seconds", "cost_usd", "entries"]
    list_filter = ["team", "cluster", "accelerator"]
    readonly_fields = [f.name for f in DailyCostRollup._meta.fields]


@admin.register(UtilizationRollup)
class UtilizationRollupAdmin(admin.ModelAdmin):
    list_display = ["day", "attempt", "team", "cluster", "avg_gpu_util_percent", "samples", "expected_samples",
                    "idle_gpu_seconds"]
    list_filter = ["team", "cluster", "accelerator"]
    readonly_fields = [f.name for f in UtilizationRollup._meta.fields]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(admin.ModelAdmin):
    list_display = ["budget", "period_start", "threshold_percent", "fired_at", "spent_usd", "amount_usd"]
    readonly_fields = [f.name for f in BudgetAlert._meta.fields]


@admin.register(LedgerDiscrepancy)
class LedgerDiscrepancyAdmin(admin.ModelAdmin):
    list_display = ["cluster", "window_start", "window_end", "ledger_gpu_hours", "metrics_gpu_hours",
                    "difference_percent", "flagged", "checked_at"]
    list_filter = ["flagged", "cluster"]
    readonly_fields = [f.name for f in LedgerDiscrepancy._meta.fields]


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    """Stored reports (read mostly); their schedules are django-celery-beat's PeriodicTask rows."""

    list_display = ("id", "team", "kind", "period_start", "period_end", "source", "generated_at", "mailed_at")
    list_filter = ("kind", "source", "team")
    readonly_fields = ("generated_at", "source", "requested_by", "mailed_at")


@admin.register(ClusterMetrics)
class ClusterMetricsAdmin(admin.ModelAdmin):
    """A cluster's DCGM label shape: detected from its series; ``shape_override`` is the operator's to set."""

    list_display = ["cluster", "detected_shape", "shape_override", "host_label", "util_metric", "detected_at"]
    readonly_fields = ["cluster", "detected_shape", "host_label", "util_metric", "series", "detected_at"]


@admin.register(UnknownCostAlert)
class UnknownCostAlertAdmin(admin.ModelAdmin):
    """Alerts of GPU-hours accrued without a price, one per attempt: read only."""

    list_display = ["attempt", "team", "since", "gpu_hours", "fired_at"]
    readonly_fields = [f.name for f in UnknownCostAlert._meta.fields]
