"""What pages show of stored machine-readable facts, in words a person reads: a waiting job's numbers
(``Job.queue_info``) as labelled facts and sentences, never a raw boolean or an internal key, and why a job's GPU
utilization is or is not shown.
"""

from __future__ import annotations

from django.conf import settings

from costs.prometheus import source_for

#: What a waiting job is short of (``queue_info["short_of"]``, else its reason), as the Queue and job pages say it.
SHORT_OF_WORDS = {
    "gpu": "free GPUs",
    "cpu": "free CPU (vCPU)",
    "memory": "free memory (GiB)",
    "nodes": "enough whole nodes",
    "cordon": "cordoned nodes back in service",
    "health": "healthy nodes or clusters",
    "price": "a node pool with a price",
    "placement": "a node pool its placement rules allow",
    "quota": "room in its team's quota",
    "budget": "room in its team's budget",
    "priority": "the jobs ahead of it in its team's queue",
    "capacity": "free capacity",
    "dependency": "the jobs it runs after to end as it asks",
}

#: Labels of the numbers a waiting job's ``queue_info`` holds (the scheduler's rules: ``jobs.scheduling.core.rules``).
FACT_LABELS = {
    "request_gpus": "GPUs asked",
    "nodes": "Nodes asked",
    "gpus_per_node": "GPUs per node",
    "request_vcpu_per_node": "vCPU per node",
    "request_gib_per_node": "Memory per node (GiB)",
    "used_gpus": "GPUs the team uses",
    "nominal_gpus": "Nominal quota (GPUs)",
    "borrowing_limit_gpus": "Borrowing limit (GPUs)",
    "lending_limit_gpus": "Lending limit (GPUs)",
    "max_gpus_per_job": "Per-job cap (GPUs)",
    "limit_gpus": "Most the team can reach (GPUs)",
    "cohort_lendable_gpus": "GPUs in the cohort's shared pool",
    "cohort_borrowed_gpus": "GPUs of the shared pool in use",
    "request_vcpus": "vCPU asked",
    "used_vcpus": "vCPU the team uses",
    "nominal_vcpus": "Nominal CPU quota (vCPU)",
    "borrowing_limit_vcpus": "CPU borrowing limit (vCPU)",
    "lending_limit_vcpus": "CPU lending limit (vCPU)",
    "max_vcpus_per_job": "Per-job CPU cap (vCPU)",
    "limit_vcpus": "Most the team can reach (vCPU)",
    "cohort_lendable_vcpus": "vCPU in the cohort's shared pool",
    "cohort_borrowed_vcpus": "vCPU of the shared pool in use",
    "budget_id": "Budget",
    "estimate_usd": "Estimate (USD)",
    "amount_usd": "Budget amount (USD)",
    "spent_usd": "Spent (USD)",
    "committed_usd": "Committed (USD)",
    "remaining_usd": "Left in the budget (USD)",
    "behind_job_id": "Behind job",
    "clusters": "Clusters",
    "unpriced_pools": "Node pools without a price",
}

#: Keys shown elsewhere on the page, or only machine-readable: never a fact row.
_NOT_FACTS = {"reason", "message", "waits_for", "position", "overtaken", "overtaken_by", "pools", "free_gpus_by_pool",
              "most_free_gpus_on_a_node_by_pool", "cluster_quota_gpus", "cluster_used_gpus", "fleet_change"}


def short_of_words(queue_info: dict) -> str:
    """What a waiting job waits for, in words (``SHORT_OF_WORDS``), from its ``short_of`` or else its reason; ""
    when the info says neither."""
    key = queue_info.get("short_of") or queue_info.get("reason") or ""
    return SHORT_OF_WORDS.get(key, key.replace("_", " "))


def _value_text(key: str, value) -> str:
    if value is None:
        return "no limit" if "limit" in key or key.startswith("max_") else "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.startswith("max_") and value == 0:
        return "no cap"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "none"
    if key == "behind_reason":
        return SHORT_OF_WORDS.get(value, str(value))
    return str(value)


def queue_facts(queue_info: dict) -> list[tuple[str, str]]:
    """The numbers of a waiting job's ``queue_info`` as ``(label, value)`` pairs a person reads: known keys by their
    label (``FACT_LABELS``), others made words; flags as sentences (``never_placeable``: that it waits for the
    fleet to change), ``short_of`` as what it waits for; None as "no limit" or "none", booleans as yes or no,
    lists joined. The reason, message, position and the per-pool numbers (in the message) are shown elsewhere."""
    facts = []
    if queue_info.get("never_placeable"):
        facts.append(("Placement", "No node pool can hold it as the fleet is now: it waits for the fleet to change "
                                   "and does not hold up its team's other jobs."))
    for key, value in queue_info.items():
        if key in _NOT_FACTS or key in ("short_of", "never_placeable") or isinstance(value, dict):
            continue
        if isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
            continue
        label = FACT_LABELS.get(key)
        if label is None:
            if key == "behind_reason":
                label = "That job waits for"
            else:
                label = key.replace("_usd", " (USD)").replace("_gpus", " (GPUs)").replace("_vcpus", " (vCPU)")
                label = label.replace("_", " ")
                label = label[:1].upper() + label[1:]
        facts.append((label, _value_text(key, value)))
    return facts


def utilization_note(job, usage: list[dict], has_rollups: bool) -> dict:
    """Whether a job page shows GPU utilization, and if not, the true reason.

    ``usage``: ``costs.aggregation.utilization_window`` rows of the job (what the API answers); ``has_rollups``:
    whether any daily rollup has an average. Utilization is shown whenever it was collected (``{"show": True}``),
    emulated GPUs or not. Otherwise ``{"show": False, "reason": <sentence>}``: a CPU-only job is not told about
    GPUs at all (``{"show": False, "cpu_only": True, "reason": ""}``); else the job has not run, no Prometheus is
    configured for its clusters, it runs and the first samples are not collected yet (on emulated GPUs too), it
    ran on emulated GPUs only, or Prometheus had no samples of it."""
    if has_rollups or any(u.get("avg_gpu_util_percent") is not None for u in usage):
        return {"show": True, "reason": ""}
    if job.accelerator.is_cpu:
        return {"show": False, "cpu_only": True, "reason": ""}
    attempts = [a for a in job.attempts.select_related("cluster") if a.started_at is not None]
    if not attempts:
        return {"show": False, "reason": "Not collected yet: the job has not started running."}
    clusters = {a.cluster.pk: a.cluster for a in attempts}.values()
    unread = sorted(c.name for c in clusters if source_for(c) is None)
    if len(unread) == len(clusters):
        return {"show": False, "reason": f"Not observed: no Prometheus is configured for cluster "
                                         f"{', '.join(unread)}, so no GPU samples are read."}
    if any(a.ended_at is None for a in attempts):  # emulated GPUs too: a local DCGM exporter may sample them
        every = _collection_minutes()
        return {"show": False, "reason": f"Not collected yet: the job is running and its first samples are not in "
                                         f"(utilization is collected every {every} min)."}
    if all(c.emulated for c in clusters):
        return {"show": False, "reason": "Not observed: the job ran on emulated GPUs (processes on the CPU) and no "
                                         "GPU samples were collected for it."}
    return {"show": False, "reason": "No data: Prometheus had no GPU samples of this job's pods."}


def _collection_minutes() -> int:
    """How often utilization is collected (the ``collect-utilization`` beat entry), whole minutes, at least 1."""
    entry = settings.CELERY_BEAT_SCHEDULE.get("collect-utilization")
    seconds = float(entry["schedule"]) if entry is not None else 900.0
    return max(1, round(seconds / 60))
