from django.contrib import admin

from .models import CostEntry, Price


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    list_display = ["provider", "region", "accelerator", "capacity_type", "cluster", "usd_per_gpu_hour", "effective_from"]
    list_filter = ["provider", "accelerator", "capacity_type"]


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
