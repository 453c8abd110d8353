"""Admin for stored reports (read mostly; schedules are django-celery-beat's PeriodicTask rows)."""

from django.contrib import admin

from .models import Report


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = ("id", "team", "kind", "period_start", "period_end", "generated_at")
    list_filter = ("kind", "team")
    readonly_fields = ("generated_at",)
