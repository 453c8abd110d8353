from django.contrib import admin

from .models import Job, JobAttempt, JobEvent, WorkloadMetrics


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    readonly_fields = [f.name for f in JobAttempt._meta.fields]
    can_delete = False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs are read-only here: state changes go through the state machine (API, UI, tasks)."""

    list_display = ["id", "name", "team", "kind", "state", "accelerator", "nodes", "gpus_per_node", "created_at"]
    list_filter = ["state", "kind", "team", "accelerator"]
    search_fields = ["name"]
    readonly_fields = ["state", "state_reason", "queue_info", "current_attempt", "estimated_cost_usd", "accrued_cost_usd",
                       "admitted_at", "started_at", "ended_at"]
    inlines = [JobAttemptInline]


@admin.register(JobAttempt)
class JobAttemptAdmin(admin.ModelAdmin):
    list_display = ["object_name", "cluster", "node_pool", "gpus", "started_at", "ended_at", "end_reason"]
    list_filter = ["cluster", "end_reason"]
    readonly_fields = [f.name for f in JobAttempt._meta.fields]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["job", "kind", "from_state", "to_state", "reason", "actor", "created_at"]
    list_filter = ["kind", "to_state"]
    readonly_fields = [f.name for f in JobEvent._meta.fields]


@admin.register(WorkloadMetrics)
class WorkloadMetricsAdmin(admin.ModelAdmin):
    """What attempts' workloads reported; written by collection only."""

    list_display = ["attempt", "source", "tokens_per_s", "flops_per_token", "tokens", "complete", "updated_at"]
    list_filter = ["source", "complete"]
    readonly_fields = [f.name for f in WorkloadMetrics._meta.fields]
