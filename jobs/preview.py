"""The dry run of a submission, one function for the web form, the API (``POST /api/v1/jobs/preview/``) and
``cpctl submit --dry-run``: where the job would run with every candidate pool and its price, the estimate, the
quota and budget verdicts, and whether submission would refuse it. Nothing is stored.

A job its budget can never cover is refused at submission like one over its quota (ADR 0036):
``refuse_unaffordable`` raises the 400 that the API and the form show.
"""

from __future__ import annotations

from decimal import Decimal

from rest_framework.exceptions import ValidationError

from core.gpus import exact_gpus, shown_gpus
from core.money import price_per_hour, usd_cents
from quotas.models import Budget

from .models import Job, total_gpus
from .scheduling.core import budget_refusal
from .scheduling.preview import Candidate, preview_placement
from .scheduling.snapshot import per_node_request, pods_of, role_shapes
from .spec import accelerator_named

#: The field a budget refusal is reported on: the run-time limit bounds the estimate the budget is checked against.
BUDGET_FIELD = "spec.max_runtime_seconds"


def job_asks(kind: str, nodes: int, gpus_per_node: int, replicas: int, resources, share_milli: int = 0) -> dict:
    """What a whole job holds, as its worst-case estimate counts it: ``{"gpus": int (a share of one GPU: an exact
    Decimal, ``share_milli`` / 1000, as the ledger bills it), "vcpus": Decimal (cores), "gib": Decimal}``; vCPUs and
    GiB are the pods' (``snapshot.pods_of``) per-node ``cpu`` and ``memory_gib`` of ``resources`` (a spec's), rounded
    up as placement counts them."""
    pods, _ = pods_of(kind, nodes, replicas)
    cpu_milli, memory_mib = per_node_request(resources)
    gpus = exact_gpus(share_milli) if share_milli else total_gpus(nodes, gpus_per_node, replicas)
    return {"gpus": gpus, "vcpus": Decimal(pods * cpu_milli) / 1000, "gib": Decimal(pods * memory_mib) / 1024}


def roles_asks(roles) -> dict:
    """``job_asks`` of a multi-role job: the sums over its roles (``RoleShape``s: ``snapshot.role_shapes``) of each
    role's pods x GPUs, CPU cores and memory GiB per pod."""
    return {"gpus": sum(r.nodes * r.gpus_per_node for r in roles),
            "vcpus": Decimal(sum(r.nodes * r.cpu_milli for r in roles)) / 1000,
            "gib": Decimal(sum(r.nodes * r.memory_mib for r in roles)) / 1024}


def stored_job_asks(job: Job) -> dict:
    """``job_asks`` of a stored ``job``: a multi-role job's sums over its roles (``spec.roles``), any other job's
    from its size and ``spec.resources``."""
    if job.kind == Job.Kind.MULTI_ROLE:
        return roles_asks(role_shapes((job.spec or {}).get("roles")))
    return job_asks(job.kind, job.nodes, job.gpus_per_node, job.replicas, (job.spec or {}).get("resources"),
                    job.gpu_share_milli)


def per_node_asks(spec) -> dict:
    """The ``cpu`` (cores) and ``memory_gib`` per node a stored spec asks, for the preview (they place a job, and
    price a CPU-only one); absent ones left out."""
    resources = (spec or {}).get("resources") or {}
    return {k: resources[k] for k in ("cpu", "memory_gib") if resources.get(k) is not None}


def _budget_name(budget_id: int) -> str:
    """``team alpha's monthly budget #3`` for messages (the id alone when the row is gone)."""
    budget = Budget.objects.select_related("team").filter(pk=budget_id).first()
    if budget is None:
        return f"budget #{budget_id}"
    return f"team {budget.team.slug}'s {budget.period} budget #{budget.pk} (block)"


def submission_preview(args: dict) -> dict:
    """Before submitting: the dry run of ``args`` (``submit_job``'s keyword arguments, from
    ``jobs.spec.validated_submission``).

    Returns ``{"team", "kind", "accelerator" (name of the chosen one), "total_gpus", "max_runtime_seconds" (s),
    "asks" (``job_asks``: what its worst case counts, GPUs or vCPUs and GiB), "pool" (the chosen ``PoolOffer`` or None), "fits_now", "estimate_usd" (Decimal USD or None), "quota" and
    "budget" (``core.Verdict``; budget None without an estimate), "candidates" (``scheduling.preview.Candidate``
    list), "refusal" (None, or ``{"field", "message"}``: submission would answer 400), "capacity" (None, or while
    it has no room now the ``core.Verdict`` a waiting job shows: its message names the short resource with
    numbers, ``detail["short_of"]`` which one), "assessment" (the chosen accelerator's ``core.Assessment``)}``.
    """
    resources, team = {**args["resources"], **per_node_asks(args["spec"])}, args["team"]
    if args["kind"] == Job.Kind.MULTI_ROLE:  # a gang of its roles' shapes, placed and priced as admission does
        resources["roles"] = role_shapes(args["spec"].get("roles"))
    names = (args["spec"].get("resources") or {}).get("alternatives") or []
    found = preview_placement(team, resources, args["spec"].get("placement") or {}, kind=args["kind"],
                              alternatives=tuple(accelerator_named(n) for n in names))
    assessment, refusal = found.assessment, None
    cheapest = found.cheapest_usd
    verdict = budget_refusal(cheapest, found.budgets) if cheapest is not None else None
    if verdict is not None:
        refusal = {"field": BUDGET_FIELD,
                   "message": f"{_budget_name(verdict.detail['budget_id'])} can never cover this job: "
                              f"{verdict.message}. Lower max_runtime_seconds or the resources, or ask for a larger "
                              f"budget.",
                   "detail": verdict.detail}
    if resources.get("roles"):
        asks = roles_asks(resources["roles"])
    else:
        asks = job_asks(args["kind"], resources["nodes"], resources["gpus_per_node"], resources.get("replicas", 1),
                        args["spec"].get("resources"), resources.get("gpu_share_milli") or 0)
    return {"team": team, "kind": args["kind"], "accelerator": found.accelerator,
            "total_gpus": asks["gpus"], "max_runtime_seconds": resources["max_runtime_seconds"], "asks": asks,
            "pool": assessment.offer, "fits_now": assessment.fits_now, "estimate_usd": assessment.estimate_usd,
            "quota": assessment.quota, "budget": assessment.budget, "candidates": found.candidates,
            "refusal": refusal, "capacity": assessment.capacity, "assessment": assessment}


def refuse_unaffordable(preview: dict) -> None:
    """Raise DRF's ValidationError (a 400 naming ``spec.max_runtime_seconds``, the budget and the numbers) when
    ``preview`` (``submission_preview``) says the job's budget can never cover it; else nothing."""
    if preview["refusal"] is not None:
        raise ValidationError({preview["refusal"]["field"]: [preview["refusal"]["message"]]})


def _price(per_hour: Decimal | None) -> str | None:
    """A pool's USD per hour for the job as the pages show it (``core.money.price_per_hour``: ``"13.76"``, not
    ``"13.760000"``); None: no price."""
    return None if per_hour is None else price_per_hour(per_hour)


def _candidate_json(row: Candidate) -> dict:
    o = row.offer
    return {"cluster": o.cluster_name, "pool": o.name or str(o.node_pool_id), "provider": o.provider,
            "region": o.region, "capacity_type": o.capacity_type, "accelerator": row.accelerator,
            "nodes": row.pods, "free_gpus": o.free_gpus, "usd_per_hour": _price(row.usd_per_hour),
            "estimated_cost_usd": usd_cents(row.estimate_usd), "fits_now": row.fits_now, "chosen": row.chosen,
            "why_not": row.why_not}


def _verdict_json(verdict) -> dict | None:
    if verdict is None:
        return None
    return {"ok": verdict.ok, "reason": verdict.reason, "message": verdict.message, "never": verdict.never}


def outcome(preview: dict) -> str:
    """``refused`` (submission answers 400), ``admit`` (it would be admitted now), or ``wait`` (it would queue:
    for capacity, quota or budget)."""
    if preview["refusal"] is not None or preview["quota"].never or (preview["budget"] and preview["budget"].never):
        return "refused"
    budget_ok = preview["budget"] is None or preview["budget"].ok
    return "admit" if preview["fits_now"] and preview["quota"].ok and budget_ok else "wait"


def preview_json(preview: dict) -> dict:
    """``submission_preview``'s answer as the API gives it: names for objects, USD as strings (estimates rounded to
    cents as every figure shown; per-hour prices exact, with every digit they have and at least to cents), the whole
    job's ``total_vcpus`` (cores) and ``total_memory_gib`` beside ``total_gpus``, the candidate pools as rows,
    ``capacity`` (null, or while it has no room now ``{"short_of": "gpu" | "cpu" | "memory" | "nodes", "message"}``,
    as the waiting job's page words it) and ``outcome``."""
    chosen = next((c for c in preview["candidates"] if c.chosen), None)
    return {"team": preview["team"].slug, "kind": preview["kind"], "accelerator": preview["accelerator"],
            "total_gpus": shown_gpus(preview["total_gpus"]), "total_vcpus": float(preview["asks"]["vcpus"]),
            "total_memory_gib": float(preview["asks"]["gib"]), "max_runtime_seconds": preview["max_runtime_seconds"],
            "placement": _candidate_json(chosen) if chosen is not None else None,
            "fits_now": preview["fits_now"], "estimated_cost_usd": usd_cents(preview["estimate_usd"]),
            "candidates": [_candidate_json(c) for c in preview["candidates"]],
            "quota": _verdict_json(preview["quota"]), "budget": _verdict_json(preview["budget"]),
            "refusal": preview["refusal"], "capacity": _capacity_json(preview.get("capacity")),
            "outcome": outcome(preview)}


def _capacity_json(verdict) -> dict | None:
    if verdict is None:
        return None
    return {"short_of": verdict.detail.get("short_of", "nodes"), "message": verdict.message}


def stored_job_args(job) -> dict:
    """``submission_preview``'s argument for a stored ``job`` (Job): its team, kind, spec and resources columns."""
    return {"team": job.team, "kind": job.kind, "spec": job.spec or {},
            "resources": {"accelerator": job.accelerator, "gpus_per_node": job.gpus_per_node, "nodes": job.nodes,
                          "replicas": job.replicas, "priority": job.priority, "preemptible": job.preemptible,
                          "max_runtime_seconds": job.max_runtime_seconds, "gpu_share_milli": job.gpu_share_milli,
                          "mig_profile": job.mig_profile}}
