"""An inference job of 2 replicas x 3 GPUs holds 6 GPUs everywhere: admission, quota, capacity, the estimate, the
attempt the ledger bills, and the API; the cluster runs 2 pods of 3 GPUs."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from costs.ledger import accrue_attempt
from costs.models import CostEntry
from jobs.lifecycle import dispatch
from jobs.models import Job, JobState
from jobs.scheduling.offers import pool_offers
from jobs.scheduling.snapshot import team_used_gpus
from runners.models import Cluster
from tests.support.clusters import state


def test_replicas_count_in_quota_capacity_estimate_ledger_and_views(live_clusters, owner):
    world = live_clusters
    attempt = world.admit(kind="inference", replicas=2, gpus=3, cluster="gcp-usc1", max_runtime=7200)
    job = Job.objects.get(pk=attempt.job_id)
    assert job.total_gpus == 6 and attempt.gpus == 6
    assert team_used_gpus(job.team_id, job.accelerator_id) == 6
    offers = {o.cluster_name: o for o in pool_offers(job.accelerator_id, attempt.created_at, lock=False)}
    assert offers["gcp-usc1"].free_gpus == 16 - 6
    # 6 GPUs x 2 h x 2.50 USD/GPU-h (gcp's price)
    assert job.estimated_cost_usd == Decimal("30.000000")

    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    assert state(attempt) == JobState.RUNNING
    pods = world.emulators["gcp-usc1"].pods(attempt.pk)
    assert len(pods) == 2
    assert all(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "3" for p in pods)

    started = Job.objects.get(pk=job.pk).attempts.get().started_at
    # A live attempt is billed up to its cluster's last contact: the cluster answered for those 2 h.
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=started + dt.timedelta(hours=2))
    accrue_attempt(attempt.pk, until=started + dt.timedelta(hours=2))
    gpu_seconds = sum((e.gpus * (e.interval_end - e.interval_start) for e in CostEntry.objects.filter(attempt_id=attempt.pk)),
                      dt.timedelta())
    assert gpu_seconds == dt.timedelta(hours=12)  # 2 pods x 3 GPUs x 2 h

    answer = owner.client.get(f"/api/v1/jobs/{job.pk}/")
    assert answer.status_code == 200 and answer.json()["total_gpus"] == 6
