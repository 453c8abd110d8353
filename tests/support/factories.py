"""One builder per kind of test object: the catalog, clusters with a node pool, quotas, budgets, jobs and attempts.

Jobs come in two kinds: ``make_job`` stores a job the way the API does (``submit_job``: the row and its
``submitted`` event), ``make_job_row`` writes the bare row (no event) for tests of the scheduler, the state
machine, the ledger and the runners. Fixtures build the common worlds from them: one AWS cluster
(``aws_cluster``), the same with alpha's quota and budget (``funded_aws_cluster``), and each team's job, quota
and budget (``alpha_objects``, ``beta_objects``).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from decimal import Decimal

import pytest
from django.utils import timezone

from costs.ledger import post_entries
from costs.models import CostEntry, Price
from costs.seed import CATALOG_EFFECTIVE_FROM, seed_accelerators, seed_cpu_prices, seed_prices
from jobs.efficiency.protocol import RunStats, parse_log
from jobs.lifecycle import mark_started, submit_job
from jobs.models import PRIORITY_CLASSES, Job, JobAttempt, JobState, WorkloadMetrics
from jobs.states import transition
from quotas.models import Budget, Quota
from runners.models import Accelerator, Cluster, Node, NodePool, cpu_flavor

#: A valid job spec with every field set: 2 nodes x 8 H100 GPUs for an hour, preemptible, placed in aws us-east-1.
VALID_SPEC = {
    "image": "python:3.11",
    "command": ["python", "-c", "print('hello')"],
    "args": ["--steps", "10"],
    "env": {"PYTHONUNBUFFERED": "1"},
    "resources": {"accelerator": "H100-80GB", "gpus_per_node": 8, "nodes": 2, "cpu": 4, "memory_gib": 32.5},
    "priority": "high",
    "max_runtime_seconds": 3600,
    "preemptible": True,
    "placement": {"providers": ["aws"], "regions": ["us-east-1"], "clusters": []},
    "max_retries": 1,
}


# --- the catalog and the fleet ----------------------------------------------------------------------------------

@pytest.fixture
def catalog(db):
    """Accelerators and the public price catalog; ``{name: Accelerator}``."""
    seed_accelerators()
    seed_prices()
    return {a.name: a for a in Accelerator.objects.all()}


@pytest.fixture
def h100(catalog):
    return catalog["H100-80GB"]


def time_sliced_and_plain_nodes(pool, *, shared_gpus: int, replicas: int = 4, plain_gpus: int = 8) -> None:
    """Two synced nodes in ``pool``: ``ts``, whose ``shared_gpus`` physical GPUs are time-sliced ``replicas`` ways
    (no whole GPU to offer: ADR 0040), and ``plain``, with ``plain_gpus`` whole GPUs; 96 cores and 1 TiB each."""
    now = timezone.now()
    Node.objects.create(cluster=pool.cluster, node_pool=pool, name="ts", gpus=shared_gpus, cpu_milli=96000,
                        memory_mib=1 << 20, seen_at=now, gpu_sharing="time-slicing", gpu_replicas=replicas,
                        slice_resource="nvidia.com/gpu", whole_gpus=0)
    Node.objects.create(cluster=pool.cluster, node_pool=pool, name="plain", gpus=plain_gpus, cpu_milli=96000,
                        memory_mib=1 << 20, seen_at=now)


def make_cluster(name, provider, region, accelerator, *, nodes=2, gpus_per_node=8, capacity_type="on-demand",
                 backend="kubernetes", price=None) -> tuple[Cluster, NodePool]:
    """A cluster with one node pool of ``nodes`` x ``gpus_per_node`` GPUs; returns ``(cluster, pool)``.

    ``price`` (USD per GPU-hour, a string) adds a cluster override in force since the catalog epoch; without
    it the catalog's price for the provider and region applies (none for ``onprem``).
    """
    cluster = Cluster.objects.create(name=name, provider=provider, region=region, backend=backend)
    pool = NodePool.objects.create(cluster=cluster, name=f"{accelerator.name.lower()}-{capacity_type}",
                                   accelerator=accelerator, capacity_type=capacity_type, nodes=nodes,
                                   gpus_per_node=gpus_per_node)
    if price is not None:
        Price.objects.create(provider=provider, region=region, accelerator=accelerator, capacity_type=capacity_type,
                             cluster=cluster, usd_per_gpu_hour=Decimal(price), effective_from=CATALOG_EFFECTIVE_FROM)
    return cluster, pool


@pytest.fixture
def cluster_factory(catalog):
    """``make_cluster`` with the catalog seeded."""
    return make_cluster


@pytest.fixture
def cpu(catalog):
    """The CPU flavor (returned) with a gcp-usc1 pool of 4 synced nodes x 16 cores, 64 GiB; the CPU prices seeded."""
    seed_cpu_prices()
    flavor = cpu_flavor()
    _, pool = make_cluster("gcp-usc1", "gcp", "us-central1", flavor, nodes=4, gpus_per_node=0)
    for i in range(4):
        Node.objects.create(cluster=pool.cluster, node_pool=pool, name=f"cpu-{i}", gpus=0, cpu_milli=16000,
                            memory_mib=64 * 1024, seen_at=timezone.now())
    return flavor


@pytest.fixture
def aws_cluster(catalog):
    """One AWS cluster (us-east-1) with an H100 pool of 2 nodes x 8 GPUs at the catalog price (6.88 USD/GPU-h);
    ``{"cluster": Cluster, "pool": NodePool}``."""
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=2, gpus_per_node=8)
    return {"cluster": cluster, "pool": pool}


@pytest.fixture
def funded_aws_cluster(aws_cluster, teams, quota_factory, budget_factory, h100):
    """``aws_cluster`` with alpha's H100 quota (16 nominal, 4 borrowing, 8 per job) and $1000 block budget;
    ``{"cluster", "pool", "quota", "budget"}``."""
    quota = quota_factory(teams[0], h100, 16, borrowing=4, max_per_job=8)
    budget = budget_factory(teams[0], "1000.00")
    return {**aws_cluster, "quota": quota, "budget": budget}


# --- quotas and budgets -------------------------------------------------------------------------------------------

@pytest.fixture
def quota_factory(db):
    """``make(team, accelerator, nominal, borrowing=0, max_per_job=0)``: a Quota for every cluster."""
    def make(team, accelerator, nominal, borrowing=0, max_per_job=0):
        return Quota.objects.create(team=team, accelerator=accelerator, nominal_gpus=nominal,
                                    borrowing_limit_gpus=borrowing, max_gpus_per_job=max_per_job)
    return make


@pytest.fixture
def alpha_h100_quota(teams, h100):
    """Alpha's team-wide H100 quota, 32 GPUs nominal: without a quota for its accelerator a submission is refused,
    so tests of an accepted submission that are not about quota ask for this one."""
    return Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=32)


@pytest.fixture
def budget_factory(db):
    """``make(team, amount, action="block", period="monthly")``: a Budget of ``amount`` USD (a string)."""
    def make(team, amount, action="block", period="monthly"):
        return Budget.objects.create(team=team, amount_usd=Decimal(amount), action=action, period=period)
    return make


# --- jobs and attempts --------------------------------------------------------------------------------------------

@pytest.fixture
def submission():
    """A valid submission for team alpha (``VALID_SPEC``), deep-copied so tests may break it."""
    return {"team": "alpha", "name": "train-small", "kind": "training", "spec": copy.deepcopy(VALID_SPEC)}


def make_job(team, submitter, accelerator, *, name="job", gpus_per_node=1, nodes=1, state=None) -> Job:
    """A job stored the way the API stores it (``submit_job``: the row and its ``submitted`` event), from
    ``VALID_SPEC`` with the given resources at normal priority; ``state`` is then forced for the test."""
    spec = copy.deepcopy(VALID_SPEC)
    spec["resources"].update(accelerator=accelerator.name, gpus_per_node=gpus_per_node, nodes=nodes)
    job = submit_job(
        team=team, submitter=submitter, name=name, kind="training", spec=spec,
        resources={"accelerator": accelerator, "gpus_per_node": gpus_per_node, "nodes": nodes,
                   "priority": PRIORITY_CLASSES["normal"], "preemptible": False, "max_runtime_seconds": 3600,
                   "max_retries": 0},
    )
    if state is not None:
        Job.objects.filter(pk=job.pk).update(state=state)
        job.refresh_from_db()
    return job


def make_job_row(team, submitter, accelerator, *, name="job", kind="training", state=JobState.QUEUED,
                 gpus_per_node=1, nodes=1, priority=500, preemptible=False, max_runtime=3600, max_retries=0,
                 placement=None, spec=None, **columns) -> Job:
    """A bare Job row (no event) in ``state``: the columns the scheduler reads and a spec that matches them.

    ``spec`` replaces the generated spec (for tests that need particular commands or none at all);
    ``columns`` sets further Job fields (``estimated_cost_usd``, ...). Seconds for ``max_runtime``.
    """
    if spec is None:
        spec = {
            "image": "python:3.11", "command": ["python", "train.py"],
            "resources": {"accelerator": accelerator.name, "gpus_per_node": gpus_per_node, "nodes": nodes},
            "priority": priority, "max_runtime_seconds": max_runtime, "preemptible": preemptible,
            "placement": placement or {}, "max_retries": max_retries,
        }
    columns.setdefault("replicas", int(spec.get("replicas") or 1) if isinstance(spec, dict) else 1)
    return Job.objects.create(
        team=team, submitter=submitter, name=name, kind=kind, spec=spec, accelerator=accelerator,
        gpus_per_node=gpus_per_node, nodes=nodes, priority=priority, preemptible=preemptible,
        max_runtime_seconds=max_runtime, max_retries=max_retries, state=state, **columns,
    )


_NOW = object()


def make_attempt(job, cluster, pool, *, number=1, gpus=None, started_at=_NOW, ended_at=None, usd_per_gpu_hour="6.88",
                 state=JobState.RUNNING, object_name=None) -> JobAttempt:
    """Attempt ``number`` of ``job`` on ``pool``, made the job's current one, with the job moved to ``state``.

    ``gpus`` defaults to the job's total; ``started_at`` to now (``None``: never started); ``usd_per_gpu_hour``
    is the price recorded at admission (the ledger reads the price catalog, not this); ``object_name`` defaults
    to the platform's ``job-<job id>-<number>``.
    """
    attempt = JobAttempt.objects.create(
        job=job, number=number, cluster=cluster, node_pool=pool, gpus=job.total_gpus if gpus is None else gpus,
        object_name=object_name or f"job-{job.pk}-{number}", usd_per_gpu_hour=usd_per_gpu_hour,
        started_at=timezone.now() if started_at is _NOW else started_at, ended_at=ended_at,
    )
    Job.objects.filter(pk=job.pk).update(current_attempt=attempt, state=state)
    job.refresh_from_db()
    return attempt


def make_cost_entry(attempt, start, duration: dt.timedelta, amount, *, gpus=None, usd_per_gpu_hour="6.88",
                    gpu_milli=None) -> CostEntry:
    """A ledger row written by hand: ``attempt`` (its job, team, cluster, pool's accelerator) over ``[start,
    start + duration)``, ``gpus`` whole GPUs (default the attempt's) or ``gpu_milli`` milli-GPUs (a share) at
    ``usd_per_gpu_hour``, costing ``amount`` USD; posted with its running totals (``costs.ledger.post_entries``), as
    accrual would."""
    entry = CostEntry(
        attempt=attempt, job=attempt.job, team=attempt.job.team, cluster=attempt.cluster,
        accelerator=attempt.node_pool.accelerator, interval_start=start, interval_end=start + duration,
        gpu_milli=gpu_milli if gpu_milli is not None else 1000 * (attempt.gpus if gpus is None else gpus),
        usd_per_gpu_hour=Decimal(usd_per_gpu_hour),
        amount_usd=Decimal(amount),
    )
    post_entries([entry])
    return entry


@pytest.fixture
def queue_job(h100, user):
    """``queue_job(team, gpus_per_node, nodes=1, *, priority, preemptible, max_runtime, placement, max_retries,
    accelerator)``: a QUEUED job row submitted by alpha's admin, for scheduler tests; named ``job-1``,
    ``job-2``... in creation order."""
    counter = itertools.count(1)

    def make(team, gpus_per_node, nodes=1, *, priority=500, preemptible=False, max_runtime=3600, placement=None,
             max_retries=0, accelerator=None):
        return make_job_row(team, user, accelerator or h100, name=f"job-{next(counter)}", gpus_per_node=gpus_per_node,
                            nodes=nodes, priority=priority, preemptible=preemptible, max_runtime=max_runtime,
                            placement=placement, max_retries=max_retries)
    return make


def fresh(job) -> Job:
    """``job`` read again from the database."""
    return Job.objects.get(pk=job.pk)


def run(job) -> tuple[Job, JobAttempt]:
    """Take an ADMITTED job to RUNNING through the lifecycle (objects created, then all pods running);
    returns the job (read again) and its attempt."""
    job = fresh(job)
    attempt = job.current_attempt
    mark_started(job, attempt, {"test": True})
    transition(job, "RUNNING", reason="all nodes running", attempt=attempt)
    return fresh(job), attempt


# --- each team's objects ------------------------------------------------------------------------------------------

@pytest.fixture
def alpha_objects(teams, owner, teammate, aws_cluster, h100):
    """Team alpha's QUEUED job (submitted by the teammate), 16-GPU H100 quota and $1000 block budget."""
    alpha = teams[0]
    return {
        "job": make_job(alpha, teammate.user, h100, name="alpha-job"),
        "quota": Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=16),
        "budget": Budget.objects.create(team=alpha, amount_usd="1000.00", action="block"),
    }


@pytest.fixture
def alpha_ledger(alpha_objects, aws_cluster):
    """Twenty one-minute ledger rows of alpha's job on 2026-03-10 from 12:00 UTC (returned), 0.10 and 0.20 USD
    alternately: exactly 3.00 in Decimals, where binary floats would drift; and 0.005 alone a day later, which
    rounds half-even to 0.00 (shown as 0.005 on its own, being above 0) and leaves the total at 3.00."""
    attempt = make_attempt(alpha_objects["job"], aws_cluster["cluster"], aws_cluster["pool"])
    base = dt.datetime(2026, 3, 10, 12, 0, tzinfo=dt.timezone.utc)
    minute = dt.timedelta(minutes=1)
    for i in range(10):
        make_cost_entry(attempt, base + 2 * i * minute, minute, "0.100000000", gpus=1, usd_per_gpu_hour="6.00")
        make_cost_entry(attempt, base + (2 * i + 1) * minute, minute, "0.200000000", gpus=1, usd_per_gpu_hour="6.00")
    make_cost_entry(attempt, base + dt.timedelta(days=1), minute, "0.005000000", gpus=1, usd_per_gpu_hour="6.00")
    return base


@pytest.fixture
def beta_objects(teams, outsider, aws_cluster, h100):
    """Team beta's QUEUED job (the outsider's), 8-GPU H100 quota and $500 alert budget."""
    beta = teams[1]
    return {
        "job": make_job(beta, outsider.user, h100, name="beta-job"),
        "quota": Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=8),
        "budget": Budget.objects.create(team=beta, amount_usd="500.00", action="alert"),
    }


def make_workload_metrics(attempt, log: str):
    """The WorkloadMetrics row of ``attempt`` as collection would store it after reading ``log`` (its workload's
    log lines, ``jobs.efficiency.protocol``)."""
    stats = RunStats()
    stats.add_all(parse_log(log), at=0.0)
    return WorkloadMetrics.objects.create(attempt=attempt, stats=stats.to_dict(), tokens_per_s=stats.run_tokens_per_s,
                                          flops_per_token=stats.flops_per_token, tokens=stats.tokens)
