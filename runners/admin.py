from django.contrib import admin

from .models import Accelerator, Cluster, NodePool


@admin.register(Accelerator)
class AcceleratorAdmin(admin.ModelAdmin):
    list_display = ["name", "memory_gib", "peak_bf16_tflops", "product_label"]


class NodePoolInline(admin.TabularInline):
    model = NodePool
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "provider", "region", "backend", "emulated", "health", "last_contact_at"]
    list_filter = ["provider", "backend", "health"]
    inlines = [NodePoolInline]


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ["__str__", "accelerator", "capacity_type", "nodes", "gpus_per_node"]
    list_filter = ["accelerator", "capacity_type", "cluster"]
