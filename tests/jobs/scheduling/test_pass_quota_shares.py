"""Quotas and estimates count a job on part of one GPU as its share, exactly (ADR 0040), through submission and the
scheduling pass: a team with a quota of one GPU runs four quarters and a fifth waits for quota; a request equal to
what is left is admitted; the estimate is the share x max runtime x price. Figures worked out by hand."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest

from jobs.models import Job, JobState
from jobs.scheduling.passes import schedule_pending
from jobs.scheduling.snapshot import team_used_gpus
from quotas.models import Quota
from tests.support.factories import fresh, make_cluster, time_sliced_and_plain_nodes

JOBS = "/api/v1/jobs/"


@pytest.fixture
def fleet(catalog, teams):
    """aws-use1 at $4.20/GPU-h: an H100 pool of a time-sliced node (4 GPUs x 4 slices: room for 16 quarters) and a
    plain node of 8 GPUs, so quota, not room, decides."""
    h100 = catalog["H100-80GB"]
    _, pool = make_cluster("aws-use1", "aws", "us-east-1", h100, nodes=2, gpus_per_node=4, price="4.20")
    time_sliced_and_plain_nodes(pool, shared_gpus=4)
    return h100


def submit(client, submission, gpus, name: str) -> Job:
    submission = copy.deepcopy(submission)
    submission["name"] = name
    submission["spec"]["preemptible"] = False
    submission["spec"]["resources"] = {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": 1}
    r = client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    return Job.objects.get(pk=r.json()["id"])


def test_a_quota_of_one_gpu_runs_four_quarters_and_a_fifth_waits_for_quota(fleet, teams, teammate, submission):
    Quota.objects.create(team=teams[0], accelerator=fleet, nominal_gpus=1)
    quarters = [submit(teammate.client, submission, 0.25, f"q{i}") for i in range(5)]

    schedule_pending()

    states = [fresh(j).state for j in quarters]
    assert states == [JobState.ADMITTED] * 4 + [JobState.QUEUED]
    fifth = fresh(quarters[4])
    assert fifth.queue_info["reason"] == "quota"
    assert "1 of 1 GPUs in use; 0.25 more" in fifth.queue_info["message"]
    assert team_used_gpus(teams[0].pk, fleet.pk) == 1
    # the estimate counts the share: 0.25 GPU x 3600 s / 3600 x $4.20
    assert {fresh(j).estimated_cost_usd for j in quarters[:4]} == {Decimal("1.05")}


def test_a_request_equal_to_what_is_left_is_admitted(fleet, teams, teammate, submission):
    Quota.objects.create(team=teams[0], accelerator=fleet, nominal_gpus=2)
    first = [submit(teammate.client, submission, g, f"a{i}") for i, g in enumerate((0.3, 0.45))]
    schedule_pending()
    assert [fresh(j).state for j in first] == [JobState.ADMITTED] * 2
    assert team_used_gpus(teams[0].pk, fleet.pk) == Decimal("0.75")

    rest = [submit(teammate.client, submission, 0.25, "exact"), submit(teammate.client, submission, 1, "whole")]
    schedule_pending()  # 0.75 + 0.25 + 1 = 2: exactly the quota
    assert [fresh(j).state for j in rest] == [JobState.ADMITTED] * 2
    assert team_used_gpus(teams[0].pk, fleet.pk) == 2

    more = submit(teammate.client, submission, 0.01, "more")
    schedule_pending()
    assert fresh(more).state == JobState.QUEUED and fresh(more).queue_info["reason"] == "quota"


def test_a_share_over_a_quota_below_one_gpu_is_never_run(fleet, teams, teammate, submission):
    Quota.objects.create(team=teams[0], accelerator=fleet, nominal_gpus=0, borrowing_limit_gpus=0)
    r = teammate.client.post(JOBS, {**copy.deepcopy(submission), "name": "none", "spec": {
        **copy.deepcopy(submission["spec"]), "preemptible": False,
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 0.5, "nodes": 1}}}, format="json")
    assert r.status_code == 400, r.content  # no GPU of quota to reach: refused at submission, as a whole GPU is
