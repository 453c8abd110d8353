"""Multi-role jobs admitted as one gang (ADR 0039): every role node-exact on one pool of one cluster, quota and
budget on the sum of the roles, and a job whose one role cannot be placed holds nothing, its queue reason naming
that role.

The fleet: a cluster whose runner starts multi-role jobs (backend ``local``; ``kubernetes`` starts them too) in aws
us-east-1, its H100 pool of 2 synced nodes x 8 GPUs at the catalog price (6.88 USD/GPU-h); alpha has 32 H100 GPUs of quota unless a test says
otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from costs.ledger import accrue_attempt
from jobs.models import Job, JobAttempt, JobState
from jobs.scheduling.core import RoleShape
from jobs.scheduling.passes import schedule_pending
from runners.models import Cluster, Node
from tests.support.factories import fresh, make_cluster
from tests.support.personas import signed_in
from tests.support.scheduling import admitted, decide
from tests.support.scheduling import job as core_job
from tests.support.scheduling import pool as core_pool
from tests.support.scheduling import team as core_team

JOBS = "/api/v1/jobs/"
S = JobState


@pytest.fixture
def nodes(catalog):
    """The H100 pool of aws-use1 (backend local) with its two nodes synced (8 GPUs, 96 cores, 1 TiB each)."""
    _, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=2, gpus_per_node=8,
                           backend="local")
    for i in range(2):
        Node.objects.create(cluster=pool.cluster, node_pool=pool, name=f"h100-{i}", gpus=8, cpu_milli=96000,
                            memory_mib=1024 * 1024, seen_at=timezone.now())
    return pool


def role(gpus: int, nodes: int = 1, **extra) -> dict:
    return {"image": "python:3.11", "command": ["python", "rl.py"],
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes}, **extra}


def submit(client, roles: dict, *, runtime: int = 3600, name: str = "grpo") -> Job:
    body = {"team": "alpha", "name": name, "kind": "multi-role",
            "spec": {"roles": roles, "max_runtime_seconds": runtime}}
    r = client.post(JOBS, body, format="json")
    assert r.status_code == 201, r.content
    return Job.objects.get(pk=r.json()["id"])


def held_gpus(team) -> int:
    return sum(JobAttempt.objects.filter(job__team=team, ended_at__isnull=True).values_list("gpus", flat=True))


def test_the_roles_are_admitted_together_each_on_nodes_of_its_own_shape(teammate, alpha, nodes, alpha_h100_quota):
    job = submit(teammate.client, {"learner": role(4), "rollout": role(4, nodes=2, port=8000, completion=False)})

    assert schedule_pending().admitted == [job.pk]

    job = fresh(job)
    attempt = job.current_attempt
    assert job.state == S.ADMITTED
    assert attempt.gpus == 4 + 2 * 4 == held_gpus(alpha)
    roles = attempt.placement["roles"]
    assert list(roles) == ["learner", "rollout"]
    assert len(roles["learner"]["nodes"]) == 1 and roles["learner"]["gpus_per_node"] == 4
    assert sorted(roles["rollout"]["nodes"]) == ["h100-0", "h100-1"]  # a rollout on each node: distinct nodes
    assert attempt.placement["nodes"] == roles["learner"]["nodes"] + roles["rollout"]["nodes"]
    # 12 GPUs x 6.88 USD/GPU-h x 1 h, worked out by hand
    assert job.estimated_cost_usd == Decimal("82.56")


def test_a_role_that_cannot_be_placed_holds_nothing_and_the_reason_names_it(teammate, alpha, nodes,
                                                                            alpha_h100_quota):
    # The two rollouts (placed first: the role of most pods) take 4 GPUs on each node; the learner needs a whole
    # node of 8: none is left. Each role alone would fit.
    job = submit(teammate.client, {"learner": role(8), "rollout": role(4, nodes=2, port=8000, completion=False)})

    assert schedule_pending().admitted == []

    job = fresh(job)
    assert job.state == S.QUEUED and job.current_attempt is None
    assert not JobAttempt.objects.filter(job=job).exists()
    assert held_gpus(alpha) == 0
    info = job.queue_info
    assert info["reason"] == "capacity" and info["role"] == "learner"
    assert info["message"].startswith("Role learner cannot be placed with the job's other roles on one pool")
    assert "holds nothing meanwhile" in info["message"]
    # the nodes are free for others: a single-role job of one whole node is admitted at once
    other = submit(teammate.client, {"learner": role(8)}, name="alone")
    assert schedule_pending().admitted == [other.pk]


def test_every_role_runs_on_one_cluster(teammate, alpha, catalog, alpha_h100_quota):
    # Two clusters of one 8-GPU node each: each could hold either role alone, none both.
    for name in ("aws-use1-a", "aws-use1-b"):
        cluster, pool = make_cluster(name, "aws", "us-east-1", catalog["H100-80GB"], nodes=1, gpus_per_node=8,
                                     backend="local")
        Node.objects.create(cluster=cluster, node_pool=pool, name=f"{name}-0", gpus=8, cpu_milli=96000,
                            memory_mib=1024 * 1024, seen_at=timezone.now())
    job = submit(teammate.client, {"learner": role(8), "rollout": role(8, port=8000, completion=False)})

    assert schedule_pending().admitted == []

    info = fresh(job).queue_info
    assert held_gpus(alpha) == 0
    assert info["role"] == "rollout"
    assert "cannot be placed with the job's other roles on one pool" in info["message"]


def test_quota_counts_the_sum_of_the_roles(teammate, alpha, nodes, quota_factory, h100):
    quota_factory(alpha, h100, 14)
    first = submit(teammate.client, {"learner": role(4)}, name="first")
    assert schedule_pending().admitted == [first.pk]
    # 4 in use + 12 = 16 > 14, though each role alone (4, 8) would fit
    job = submit(teammate.client, {"learner": role(4), "rollout": role(4, nodes=2, port=8000, completion=False)})

    assert schedule_pending().admitted == []

    info = fresh(job).queue_info
    assert info["reason"] == "quota" and info["request_gpus"] == 12
    assert held_gpus(alpha) == 4


def test_the_budget_counts_the_sum_of_the_roles(teammate, alpha, nodes, alpha_h100_quota, budget_factory):
    # A first job commits 4 x 6.88 = 27.52 of 100 USD; 72.48 is left: the gang's 12 GPUs x 6.88 x 1 h = 82.56 USD
    # is over it, though each role alone (27.52, 55.04) is within it.
    budget_factory(alpha, "100.00")
    first = submit(teammate.client, {"learner": role(4)}, name="first")
    assert schedule_pending().admitted == [first.pk]
    job = submit(teammate.client, {"learner": role(4), "rollout": role(4, nodes=2, port=8000, completion=False)})

    assert schedule_pending().admitted == []
    assert fresh(job).queue_info["reason"] == "budget"


def billed_for(client, held: dt.timedelta) -> Job:
    """A learner of 4 GPUs and 2 rollouts of 1 GPU admitted, run and billed by the ledger for ``held``."""
    job = submit(client, {"learner": role(4), "rollout": role(1, nodes=2, port=8000, completion=False)},
                 runtime=7200)
    assert schedule_pending().admitted == [job.pk]
    attempt = fresh(job).current_attempt
    t0 = timezone.now().replace(microsecond=0) - dt.timedelta(hours=2)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=t0)
    Job.objects.filter(pk=job.pk).update(state=S.RUNNING, started_at=t0)
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=t0 + held)
    accrue_attempt(attempt.pk, until=t0 + held)
    return job


def test_each_roles_cost_is_its_own_gpu_hours_at_the_price_and_they_add_up_to_the_ledger(teammate, alpha, nodes,
                                                                                        alpha_h100_quota):
    job = billed_for(teammate.client, dt.timedelta(minutes=90))

    answer = teammate.client.get(f"{JOBS}{job.pk}/").json()

    roles = answer["roles"]
    assert list(roles) == ["learner", "rollout"]
    # by hand: 4 GPUs x 1.5 h x 6.88 USD/GPU-h = 41.28; 2 pods x 1 GPU x 1.5 h x 6.88 = 20.64
    assert (roles["learner"]["gpu_hours"], roles["learner"]["cost_usd"]) == (6.0, "41.28")
    assert (roles["rollout"]["gpu_hours"], roles["rollout"]["cost_usd"]) == (3.0, "20.64")
    assert (roles["rollout"]["pods"], roles["rollout"]["gpus"], roles["rollout"]["completion"]) == (2, 2, False)
    assert answer["accrued_cost_usd"] == "61.92"  # the ledger's line for the whole attempt
    # a job of another kind has none
    r = teammate.client.post(JOBS, {"team": "alpha", "name": "single", "spec": {**role(1), "max_runtime_seconds": 60}},
                             format="json")
    assert r.status_code == 201, r.content
    assert teammate.client.get(f"{JOBS}{r.json()['id']}/").json()["roles"] is None


def test_a_kubernetes_cluster_is_offered_to_a_multi_role_job(teammate, alpha, aws_cluster, alpha_h100_quota):
    # aws_cluster's backend is kubernetes, whose runner starts roles (a Service and an Indexed Job per role)
    job = submit(teammate.client, {"learner": role(1), "rollout": role(1, nodes=2, port=8000, completion=False)})

    assert schedule_pending().admitted == [job.pk]

    attempt = fresh(job).current_attempt
    assert attempt.cluster == aws_cluster["cluster"] and set(attempt.placement["roles"]) == {"learner", "rollout"}


def test_a_pool_whose_runner_cannot_start_roles_is_never_chosen():
    # The core's rule, for a backend without roles (``PoolOffer.multi_role`` false): such a pool is never offered
    # to a multi-role job, which waits for a fleet change holding nothing, while a job of one role of the same
    # size is placed there.
    offer = dataclasses.replace(core_pool(1, 16), multi_role=False)
    gang = dataclasses.replace(core_job(1, 1), roles=(RoleShape("learner", 1, 1),))
    single = core_job(1, 1)

    decisions, _ = decide([core_team(1, 64)], [offer], [gang, single])

    assert admitted(decisions) == [single.job_id]
    info = decisions.waiting[gang.job_id].info()
    assert info["never_placeable"] is True and "runner that starts multi-role jobs" in info["message"]


def test_the_job_page_shows_each_roles_cost(teammate, alpha, nodes, alpha_h100_quota):
    job = billed_for(teammate.client, dt.timedelta(hours=1))

    response = signed_in(teammate).get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    page = response.content.decode()

    # 4 GPUs x 1 h x 6.88 = 27.52; 2 x 1 GPU x 1 h x 6.88 = 13.76
    assert 'id="role-cost-learner">$27.52<' in page and 'id="role-cost-rollout">$13.76<' in page
