"""A StrictFIFO head that needs a whole node holds the node that frees first, and its queue explanation says so
(ADR 0044): which nodes, and when it expects to start."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import JobState as S
from jobs.scheduling.passes import schedule_pending
from quotas.models import Team
from runners.models import Node
from tests.support.factories import fresh

pytestmark = pytest.mark.django_db


def test_a_strict_fifo_head_is_told_which_node_is_held_for_it_and_a_short_job_behind_it_runs(
        cluster_factory, quota_factory, h100, alpha, queue_job):
    _, pool = cluster_factory("big", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="4.20")
    Node.objects.create(cluster=pool.cluster, node_pool=pool, name="gpu-0", gpus=8, cpu_milli=96_000,
                        memory_mib=1_048_576, seen_at=timezone.now())  # admissions record their nodes
    quota_factory(alpha, h100, nominal=16)
    Team.objects.filter(pk=alpha.pk).update(queueing_strategy="StrictFIFO")
    running = queue_job(alpha, 4, max_runtime=3600)
    schedule_pending()
    assert fresh(running).state == S.ADMITTED
    assert fresh(running).current_attempt.placement["nodes"] == ["gpu-0"]
    head = queue_job(alpha, 8)  # waits for the whole node: 4 of its 8 GPUs are held for up to an hour
    long_behind = queue_job(alpha, 4, max_runtime=7200)  # would still run when the head may start
    short_behind = queue_job(alpha, 4, max_runtime=600)  # ends before the head may start: it runs meanwhile
    schedule_pending()
    info = fresh(head).queue_info
    assert info["reason"] == "capacity"
    assert info["reservation"]["nodes"] == ["gpu-0"]
    assert 0 < info["reservation"]["expected_start_in_seconds"] <= 3600
    assert "reserved for it" in fresh(head).state_reason
    assert fresh(short_behind).state == S.ADMITTED
    assert fresh(long_behind).state == S.QUEUED
