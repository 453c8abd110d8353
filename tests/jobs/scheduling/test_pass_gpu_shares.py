"""Jobs on part of one GPU through submission and the scheduling pass (ADR 0040): a fraction lands on a node that
time-slices its GPUs and its attempt records its share; shares fill a GPU exactly; whole-GPU jobs keep off shared
nodes; a fraction no node could hold is refused at submission."""

from __future__ import annotations

import copy

import pytest
from django.utils import timezone

from jobs.models import Job, JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from runners.models import Node
from tests.support.factories import fresh, make_cluster, time_sliced_and_plain_nodes

JOBS = "/api/v1/jobs/"


@pytest.fixture
def fleet(catalog, teams):
    """aws-use1: an H100 pool of a time-sliced node (2 GPUs x 4 slices) and a plain node of 8 GPUs; alpha's quota."""
    h100 = catalog["H100-80GB"]
    _, pool = make_cluster("aws-use1", "aws", "us-east-1", h100, nodes=2, gpus_per_node=2)
    time_sliced_and_plain_nodes(pool, shared_gpus=2)
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=32)
    return pool


def submit(client, submission, gpus, name):
    submission["name"] = name
    submission["spec"]["resources"] = {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": 1}
    r = client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    return Job.objects.get(pk=r.json()["id"])


@pytest.mark.usefixtures("fleet")
def test_fractions_fill_a_shared_gpu_exactly_and_whole_gpus_keep_off_it(teammate, submission):
    quarters = [submit(teammate.client, copy.deepcopy(submission), g, f"f{i}")
                for i, g in enumerate((0.25, 0.75, 0.5, 0.5))]
    whole = submit(teammate.client, copy.deepcopy(submission), 2, "whole")

    schedule_pending()

    placed = [fresh(j) for j in quarters]
    assert [j.state for j in placed] == [JobState.ADMITTED] * 4
    # 0.25 + 0.75 fill one GPU exactly, 0.5 + 0.5 the other: 4 shares on the 2 GPUs of ts
    assert [j.current_attempt.placement["nodes"] for j in placed] == [["ts"]] * 4
    assert [j.current_attempt.placement["share_milli"] for j in placed] == [250, 750, 500, 500]
    whole = fresh(whole)
    assert whole.current_attempt.placement["nodes"] == ["plain"]

    fifth = submit(teammate.client, copy.deepcopy(submission), 0.01, "f-more")
    schedule_pending()
    assert fresh(fifth).state == JobState.QUEUED  # both GPUs of ts are full: 1000 + 1000 milli-GPU booked


def test_a_fraction_without_a_shared_node_is_refused_at_submission(teammate, submission, catalog, teams):
    h100 = catalog["H100-80GB"]
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8)
    Node.objects.create(cluster=cluster, node_pool=pool, name="plain", gpus=8, cpu_milli=96000, memory_mib=1 << 20,
                        seen_at=timezone.now())
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=8)
    submission["spec"]["resources"] = {"accelerator": "H100-80GB", "gpus_per_node": 0.5, "nodes": 1}

    r = teammate.client.post(JOBS, submission, format="json")

    assert r.status_code == 400, r.content
    assert any("no H100-80GB node the job may use does" in m for m in r.json()["spec.resources.gpus_per_node"])


@pytest.mark.usefixtures("fleet")
def test_a_share_stays_on_the_gpu_its_placement_records(teammate, submission):
    first = submit(teammate.client, copy.deepcopy(submission), 0.25, "quarter")
    schedule_pending()
    attempt = fresh(first).current_attempt
    assert attempt.placement["gpu"] in (0, 1)  # the admission names the GPU of ts it booked
    attempt.placement["gpu"] = 1  # say it was booked on the second GPU of ts
    attempt.save(update_fields=["placement"])

    second = submit(teammate.client, copy.deepcopy(submission), 0.75, "three-quarters")
    schedule_pending()

    # ts's GPUs are read as [1000, 750] free (the quarter on GPU 1, as recorded). A 750 share on GPU 1 leaves
    # [1000, 0], where a 750 still fits on GPU 0: nothing lost. On GPU 0 it leaves 250 there, which no 750
    # share can use: fragmentation grows. So GPU 1, exactly full; read as best fit would re-derive it (the
    # quarter on GPU 0), the 750 would go to GPU 0 instead.
    assert fresh(second).current_attempt.placement["gpu"] == 1
