from django.contrib import admin

from .models import ApiToken, Budget, Membership, Quota, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "cost_center", "created_at"]
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
class QuotaAdmin(admin.ModelAdmin):
    list_display = ["team", "accelerator", "cluster", "nominal_gpus", "borrowing_limit_gpus", "max_gpus_per_job"]
    list_filter = ["accelerator", "team"]


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = ["team", "period", "amount_usd", "action", "alert_thresholds"]
    list_filter = ["action", "period"]
