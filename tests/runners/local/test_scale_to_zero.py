"""A serving job of the demo's model that scales to zero: idle, its last replica is released (no GPU booked, no more
billing) while the job runs on; the next request is held by the endpoint while one replica is admitted and starts,
then answered; a scale-up from zero that the budget refuses answers the held request 503 with the reason."""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import requests
from django.utils import timezone

from costs.ledger import accrue_attempt
from costs.models import CostEntry
from jobs.models import Job, JobAttempt, JobEvent, JobState, ServingScale
from jobs.scheduling.passes import try_admit
from quotas.models import Quota
from runners.local.layout import read_json
from runners.local.runner import attempt_dir
from runners.models import Cluster
from serving.autoscaler import autoscale
from serving.replicas import add_replica, release_replicas
from tests.support.factories import make_job_row
from tests.support.local_runner import dispatched, wait_until

from . import test_autoscaled_serving as serving
from .test_autoscaled_serving import PROMPT, endpoint_metric
from .test_local_runner import reconcile_until

checkpoint = serving.checkpoint  # the fixtures of the demo's model served on the local runner
serving_job = serving.serving_job

SCALE_TO_ZERO = {"min_replicas": 0, "max_replicas": 1, "scale_to_zero": True, "target_in_flight_per_replica": 1,
                 "scale_up_delay_seconds": 0, "scale_down_delay_seconds": 30}


class Clock:
    """The autoscaler's clock for one job: each ``step`` is one pass 15 s later (the cluster answered then)."""

    def __init__(self, attempt: JobAttempt):
        self.attempt, self.now = attempt, timezone.now()

    def step(self) -> dict:
        self.now += dt.timedelta(seconds=15)
        Cluster.objects.filter(pk=self.attempt.cluster_id).update(last_contact_at=self.now)
        [result] = autoscale(self.now)
        return result

    def to_zero(self) -> None:
        """Step until the last replica is released; ``released_at`` is then the autoscaler's time of that pass (the
        ledger's boundary: it runs ahead of the wall clock, which stamps the ``scale`` event)."""
        wait_until(lambda: self.step()["replicas"] == 0, 60, "the job to scale to zero")
        self.released_at = self.now
        wait_until(lambda: endpoint_metric(self.attempt, "controlplane_endpoint_replicas") == 0, 10,
                   "the endpoint to list no replica")


class HeldRequest:
    """One ``POST /generate`` sent to ``endpoint`` in a thread of its own; its answer (or error) once back."""

    def __init__(self, endpoint: str):
        self.answer: requests.Response | None = None
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._send, args=(endpoint,), daemon=True)
        self.thread.start()

    def _send(self, endpoint: str) -> None:
        try:
            self.answer = requests.post(f"{endpoint}/generate", json=PROMPT, timeout=180)
        except requests.RequestException as exc:
            self.error = exc

    def wait(self) -> requests.Response:
        self.thread.join(timeout=180)
        assert self.error is None and self.answer is not None, self.error
        return self.answer


def test_an_idle_job_scales_to_zero_and_its_next_request_is_held_until_a_replica_serves_it(serving_job):
    attempt = serving_job(1, SCALE_TO_ZERO)
    clock = Clock(attempt)
    clock.to_zero()
    assert JobEvent.objects.filter(job_id=attempt.job_id, kind="scale", data__replicas=0).count() == 1

    job = Job.objects.get(pk=attempt.job_id)
    rattempt = JobAttempt.objects.get(pk=attempt.pk)
    assert job.replicas == 0 and rattempt.gpus == 0 and rattempt.placement["nodes"] == []
    meta = read_json(attempt_dir(attempt) / "attempt.json")
    wait_until(lambda: read_json(attempt_dir(attempt) / "node-0.exit"), 30, "the last replica to stop")
    assert meta["retired"] == [0]
    assert reconcile_until(attempt, {JobState.RUNNING}).state == JobState.RUNNING  # no replica ends nothing
    assert endpoint_metric(attempt, "controlplane_endpoint_ready_replicas") == 0

    # billing stops at the release: nothing accrues after it, however long the job stays at zero; the boundary is
    # the autoscaler's clock, not the event's wall-clock stamp, which lags it by the passes stepped ahead
    later = clock.now + dt.timedelta(seconds=60)
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=later)
    accrue_attempt(attempt.pk, later)
    after = CostEntry.objects.filter(attempt_id=attempt.pk, interval_start__gte=clock.released_at)
    assert after.exists()  # the minute at zero was accrued, at no GPU
    assert sum((e.amount_usd for e in after), Decimal(0)) == 0
    assert CostEntry.objects.filter(attempt_id=attempt.pk, gpu_milli=1000).exists()  # what ran before was billed

    held = HeldRequest(attempt.runner_state["endpoint"])
    wait_until(lambda: endpoint_metric(attempt, "controlplane_endpoint_in_flight") == 1, 30, "the request held")
    result = clock.step()
    assert (result["current"], result["desired"], result["replicas"]) == (0, 1, 1)
    answer = held.wait()
    assert answer.status_code == 200 and answer.json()["text"]
    assert endpoint_metric(attempt, "controlplane_endpoint_failed_requests_total") == 0
    rattempt = JobAttempt.objects.get(pk=attempt.pk)
    assert Job.objects.get(pk=job.pk).replicas == 1 and rattempt.gpus == 1 and len(rattempt.placement["nodes"]) == 1


def test_a_scale_up_from_zero_the_budget_refuses_answers_the_held_request_503_with_the_reason(
        serving_job, budget_factory, teams):
    attempt = serving_job(1, SCALE_TO_ZERO)
    clock = Clock(attempt)
    clock.to_zero()
    budget_factory(teams[0], "1.00")  # far below one replica's estimate without a max runtime

    held = HeldRequest(attempt.runner_state["endpoint"])
    wait_until(lambda: endpoint_metric(attempt, "controlplane_endpoint_in_flight") == 1, 30, "the request held")
    result = clock.step()
    assert (result["desired"], result["replicas"]) == (1, 0)
    answer = held.wait()
    refusal = ServingScale.objects.get(job_id=attempt.job_id).refusal
    assert refusal["reason"] == "budget"
    assert answer.status_code == 503 and answer.json() == {"error": "scale_from_zero_refused",
                                                           "reason": f"budget: {refusal['message']}"}
    assert Job.objects.get(pk=attempt.job_id).replicas == 0 and JobAttempt.objects.get(pk=attempt.pk).gpus == 0


def test_a_replica_admitted_from_zero_counts_only_itself_against_the_per_job_cap(two_node_local_cluster, teams, user,
                                                                                catalog):
    sleeper = {"image": "python:3.11", "command": ["python", "-c", "import time; time.sleep(120)"], "env": {},
               "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}, "replicas": 1,
               "autoscaling": SCALE_TO_ZERO}
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name="serve", kind="inference", spec=sleeper,
                       max_runtime=3600)
    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    attempt = dispatched(JobAttempt.objects.get(pk=job.current_attempt_id))
    reconcile_until(attempt, {JobState.RUNNING})
    now = timezone.now()
    assert release_replicas(job.pk, now, {"desired": 0}) == 0
    assert JobAttempt.objects.get(pk=attempt.pk).gpus == 0
    Quota.objects.filter(team=teams[0]).update(max_gpus_per_job=1)  # one replica of 1 GPU is all a job may hold

    assert add_replica(job.pk, now, {"desired": 1}) is None
    assert Job.objects.get(pk=job.pk).replicas == 1 and JobAttempt.objects.get(pk=attempt.pk).gpus == 1
    refused = add_replica(job.pk, now, {"desired": 2})
    assert refused.reason == "quota" and refused.message.startswith("2 GPUs would be more than the 1 GPUs")
