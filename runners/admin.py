"""Django admin of the fleet; a change of a cluster or its node pools appends an audit record (ADR 0031)."""

from django import forms
from django.contrib import admin

from quotas.admin import AuditedAdmin, ReasonAdminForm

from .models import Accelerator, Cluster, ClusterEvent, NodePool


@admin.register(Accelerator)
class AcceleratorAdmin(admin.ModelAdmin):
    list_display = ["name", "memory_gib", "peak_bf16_tflops", "product_label"]


class NodePoolInline(admin.TabularInline):
    model = NodePool
    extra = 0


class ClusterEventInline(admin.TabularInline):
    """The cluster's health changes, newest first; append-only."""

    model = ClusterEvent
    extra = 0
    fields = readonly_fields = ["created_at", "from_health", "to_health", "reason"]
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Cluster)
class ClusterAdmin(AuditedAdmin):
    list_display = ["name", "provider", "region", "backend", "emulated", "health", "health_since", "last_contact_at"]
    list_filter = ["provider", "backend", "health"]
    readonly_fields = ["health", "health_reason", "health_since"]
    inlines = [NodePoolInline, ClusterEventInline]
    # Credentials are never rendered: the form takes new values in password inputs that are not re-filled.

    def get_form(self, request, obj=None, **kwargs):
        kwargs["form"] = ClusterAdminForm
        return super().get_form(request, obj, **kwargs)


class ClusterAdminForm(ReasonAdminForm):
    """Cluster form whose credential fields are write-only: empty on display, kept when left empty on save."""

    api_token = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                                help_text="Leave empty to keep the stored token.")
    ca_cert = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                              help_text="PEM; leave empty to keep the stored CA.")
    kubeconfig = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                                 help_text="Leave empty to keep the stored kubeconfig.")
    prometheus_auth = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                                      label="Prometheus auth",
                                      help_text="user:password of a Prometheus behind basic auth; leave empty to "
                                                "keep the stored one.")

    class Meta:
        model = Cluster
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in CREDENTIAL_FIELDS:
            self.initial[name] = ""

    def clean(self):
        cleaned = super().clean()
        for name in CREDENTIAL_FIELDS:
            if not cleaned.get(name) and self.instance.pk:
                cleaned[name] = getattr(self.instance, name)
        return cleaned


CREDENTIAL_FIELDS = ("api_token", "ca_cert", "kubeconfig", "prometheus_auth")


@admin.register(NodePool)
class NodePoolAdmin(AuditedAdmin):
    list_display = ["__str__", "accelerator", "capacity_type", "nodes", "gpus_per_node"]
    list_filter = ["accelerator", "capacity_type", "cluster"]
