"""The Django admin's read-only view of subscriptions and the delivery log (the URL and secret never shown)."""

from django.contrib import admin

from .models import Notification, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "team", "channel", "active", "created_at")
    list_filter = ("channel", "active")
    exclude = ("webhook_url", "secret")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("id", "event", "team", "subscription", "status", "attempts", "sent_at", "response_status")
    list_filter = ("status", "event")
    readonly_fields = [f.name for f in Notification._meta.fields]
