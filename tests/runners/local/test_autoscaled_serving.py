"""A serving job of the demo's model (``examples/serve.py``) on the local runner behind its endpoint: requests balanced
over the ready replicas, a replica killed under load with no failed idempotent request, the replica count following a
synthetic load from 1 to 3 and back by the HorizontalPodAutoscaler's rule (computed here), billed as it ran, a
scale-up the budget refuses leaving the job at its size with the reason in the API and on its page, and a scale-up
booked node-exactly within the team's quota and refused past it."""

from __future__ import annotations

import datetime as dt
import math
import signal
import subprocess
import sys
import threading
import uuid
from decimal import Decimal

import pytest
import requests
from django.utils import timezone

from costs import running
from costs.ledger import accrue_attempt
from costs.models import CostEntry
from jobs.lifecycle import cancel_job
from jobs.models import Job, JobAttempt, JobEvent, JobState, ServingScale
from jobs.scheduling.passes import try_admit
from jobs.tasks import cancel_job_objects
from runners.local.layout import read_json
from runners.local.procs import ProcessRef
from runners.local.runner import attempt_dir
from runners.local.serving import endpoint_dir
from runners.models import Cluster
from serving.autoscaler import autoscale
from serving.replicas import add_replica, release_replicas
from tests.examples.workloads import REPO, TIMEOUT_S, TRAIN, clean_env
from tests.support.factories import make_job_row
from tests.support.local_runner import dispatched, wait_until
from tests.support.personas import signed_in

from .test_local_runner import reconcile_until

PROMPT = {"prompt": "To be, or not", "max_new_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A directory holding a checkpoint of the demo's model (``train_gpt.py``, one step: what serving needs)."""
    directory = tmp_path_factory.mktemp("trained")
    done = subprocess.run([sys.executable, str(TRAIN), "--steps", "1", "--batch-size", "8", "--log-every", "1",
                           "--checkpoint-dir", str(directory)], cwd=REPO, env=clean_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(directory)


@pytest.fixture
def serving_job(two_node_local_cluster, teams, user, catalog, checkpoint):
    """``make(replicas, autoscaling=None, max_retries=0, checkpoint_from=None)``: a serving job of
    ``examples/serve.py`` (1 emulated GPU per replica, no max runtime) admitted, dispatched and RUNNING on the local
    cluster, serving the module's checkpoint (``--checkpoint-dir``) or, with ``checkpoint_from``, that training
    job's (``CHECKPOINT_DIR``); returns its attempt once the endpoint has every replica ready."""

    def make(replicas: int, autoscaling: dict | None = None, max_retries: int = 0,
             checkpoint_from: int | None = None) -> JobAttempt:
        spec = {"image": "python:3.11", "command": ["python", "examples/serve.py"],
                "args": ["--checkpoint-dir", checkpoint, "--host", "127.0.0.1"], "env": {},
                "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1},
                "replicas": replicas, "port": 8000, "health_path": "/healthz", "autoscaling": autoscaling}
        if checkpoint_from is not None:
            spec.update(args=["--host", "127.0.0.1"], checkpoint_from=checkpoint_from)
        job = make_job_row(teams[0], user, catalog["H100-80GB"], name="serve-gpt", kind="inference", spec=spec,
                           max_runtime=None, replicas=replicas, max_retries=max_retries)
        assert try_admit(job.pk) == "admitted"
        job.refresh_from_db()
        attempt = dispatched(JobAttempt.objects.get(pk=job.current_attempt_id))
        reconcile_until(attempt, {JobState.RUNNING}, timeout=60)
        wait_until(lambda: endpoint_metric(attempt, "controlplane_endpoint_ready_replicas") == replicas, 90,
                   f"{replicas} ready replicas")
        return attempt

    return make


def endpoint_metric(attempt: JobAttempt, name: str, label: str | None = None) -> float | None:
    """The value of ``name`` (with ``replica="<label>"`` when given) in the endpoint's exposition, or None."""
    try:
        text = requests.get(attempt.runner_state["endpoint_metrics_url"], timeout=2).text
    except requests.ConnectionError:
        return None
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name or (label is not None and key == f'{name}{{replica="{label}"}}'):
            return float(value)
    return None


def generate(endpoint: str) -> requests.Response:
    """One ``POST /generate`` through the endpoint, marked idempotent (an ``Idempotency-Key``)."""
    return requests.post(f"{endpoint}/generate", json=PROMPT, headers={"Idempotency-Key": uuid.uuid4().hex},
                         timeout=60)


class Load:
    """``clients`` threads sending ``generate`` back to back to ``endpoint`` until ``stop``; every answer's status
    and ``header`` (default: the replica that served) kept."""

    def __init__(self, endpoint: str, clients: int, header: str = "X-Controlplane-Replica"):
        self.endpoint, self.header, self.answers, self.errors = endpoint, header, [], []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                answer = generate(self.endpoint)
                self.answers.append((answer.status_code, answer.headers.get(self.header)))
            except requests.RequestException as exc:
                self.errors.append(exc)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)


def test_the_endpoint_balances_over_the_ready_replicas_and_a_killed_one_fails_no_idempotent_request(serving_job,
                                                                                                      owner):
    attempt = serving_job(2)
    endpoint = Job.objects.get(pk=attempt.job_id).endpoint
    assert endpoint == attempt.runner_state["endpoint"]
    replicas = attempt.runner_state["replicas"]
    assert len(replicas) == 2 and endpoint.split(":")[-1] not in {r.split(":")[-1] for r in replicas}

    served = [generate(endpoint) for _ in range(20)]
    assert all(a.status_code == 200 and a.json()["text"] for a in served)
    counts = {r: sum(a.headers["X-Controlplane-Replica"] == r for a in served) for r in replicas}
    assert counts == {replicas[0]: 10, replicas[1]: 10}  # round robin over the two ready replicas

    load = Load(endpoint, clients=3)
    wait_until(lambda: len(load.answers) >= 10, 30, "answers under load")
    child = read_json(attempt_dir(attempt) / "node-1.pid")["child"]["pid"]
    subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(child)], check=True)  # the replica dies mid-load
    before = len(load.answers)
    wait_until(lambda: len(load.answers) >= before + 30, 60, "answers after the kill")
    load.stop()
    assert load.errors == [] and {status for status, _ in load.answers} == {200}
    assert {replica for _, replica in load.answers[before + 10:]} == {replicas[0]}  # the dead one gets none
    assert endpoint_metric(attempt, "controlplane_endpoint_failed_requests_total") == 0
    assert endpoint_metric(attempt, "controlplane_endpoint_ready_replicas") == 1

    # cancelled, the job's endpoint goes with its replicas
    proxy = ProcessRef.from_json(read_json(endpoint_dir(attempt.job_id) / "proxy.pid"))
    cancel_job(Job.objects.get(pk=attempt.job_id), owner.user)
    assert cancel_job_objects(attempt.job_id)
    wait_until(lambda: not proxy.alive(), 15, "the endpoint to stop")


def hpa_recommendation(current: int, metric: float, target: float) -> int:
    """The HorizontalPodAutoscaler's formula, written out here: ceil(current x metric / target), unchanged within
    a tolerance of 0.1 of the target (kubernetes.io, Horizontal Pod Autoscaling, Algorithm details)."""
    ratio = metric / target
    return current if abs(ratio - 1) <= 0.1 else math.ceil(round(current * ratio, 9))


def test_the_replicas_follow_the_load_from_1_to_3_and_back_by_the_hpa_rule_and_are_billed_as_they_ran(
        serving_job, settings):
    scaling = {"min_replicas": 1, "max_replicas": 3, "target_in_flight_per_replica": 1, "scale_up_delay_seconds": 0,
               "scale_down_delay_seconds": 30}
    attempt = serving_job(1, scaling)
    job_id, endpoint = attempt.job_id, attempt.runner_state["endpoint"]
    clock = timezone.now()
    history: list[tuple[dt.datetime, int]] = []

    def step() -> dict:
        """One pass, 15 s of the autoscaler's clock later; checks its decision against the rule computed here."""
        nonlocal clock
        clock += dt.timedelta(seconds=15)
        Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=clock)  # the cluster answered
        [result] = autoscale(clock)
        if "recommended" not in result:
            return result
        current, metric = result["current"], result["metric_per_replica"]
        expected = hpa_recommendation(current, metric, 1)
        assert result["recommended"] == expected
        # stabilization: up to the lowest recommendation of the last 0 s, down to the highest of the last 30 s
        window = [n for at, n in history if at > clock - dt.timedelta(seconds=30)] + [expected]
        stable = current
        stable = max(stable, expected)
        stable = min(stable, max(window))
        assert result["desired"] == max(1, min(3, stable)), (result, history)
        history.append((clock, expected))
        return result

    step()  # the first reading: nothing in flight
    assert Job.objects.get(pk=job_id).replicas == 1
    load = Load(endpoint, clients=4)
    wait_until(lambda: len(load.answers) >= 5, 30, "answers under load")
    step()  # the reading the load is measured from

    def at_three():
        threading.Event().wait(2.0)
        step()
        return Job.objects.get(pk=job_id).replicas == 3
    wait_until(at_three, 120, "3 replicas")
    rattempt = JobAttempt.objects.get(pk=attempt.pk)
    assert rattempt.gpus == 3 and len(rattempt.placement["nodes"]) == 3
    wait_until(lambda: endpoint_metric(attempt, "controlplane_endpoint_ready_replicas") == 3, 90, "3 ready")
    seen = len(load.answers)
    wait_until(lambda: len(load.answers) >= seen + 30, 60, "answers over 3 replicas")
    assert len({replica for _, replica in load.answers[seen:]}) == 3
    load.stop()
    assert load.errors == [] and {status for status, _ in load.answers} == {200}

    def at_one():
        threading.Event().wait(0.5)
        step()
        return Job.objects.get(pk=job_id).replicas == 1
    wait_until(at_one, 60, "back to 1 replica")
    up = JobEvent.objects.filter(job_id=job_id, kind="scale", data__replicas=3).get().created_at
    down = JobEvent.objects.filter(job_id=job_id, kind="scale", data__replicas=1).get()
    # from 3 down to 1 in one step, or through 2 when a reading still saw requests in flight after the load stopped
    # (each step the rule's: ``step`` checked every decision)
    sizes = [e.data["replicas"] for e in JobEvent.objects.filter(job_id=job_id, kind="scale").order_by("pk")]
    assert sizes[sizes.index(3):] in ([3, 1], [3, 2, 1]), sizes
    assert down.data["desired"] == 1 and down.data["current"] == sizes[-2]
    # not before the 30 s scale-down window passed over the last recommendation of 3 or more
    last_high = max(at for at, n in history if n >= 3)
    assert clock - last_high >= dt.timedelta(seconds=30)
    rattempt = JobAttempt.objects.get(pk=attempt.pk)
    assert rattempt.gpus == 1 and len(rattempt.placement["nodes"]) == 1

    # the retired replicas stop, and their end is no end of the attempt
    meta = read_json(attempt_dir(attempt) / "attempt.json")
    assert len(meta["retired"]) == 2
    wait_until(lambda: all(read_json(attempt_dir(attempt) / f"node-{n}.exit") for n in meta["retired"]), 30,
               "the retired replicas to stop")
    assert reconcile_until(attempt, {JobState.RUNNING}).state == JobState.RUNNING
    assert generate(endpoint).status_code == 200

    # billed as it ran: 1 GPU before the scale-up, 3 until the scale-down, then 1 again
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=clock + dt.timedelta(seconds=15))
    accrue_attempt(attempt.pk, clock + dt.timedelta(seconds=15))
    entries = list(CostEntry.objects.filter(attempt_id=attempt.pk).order_by("interval_start"))
    runs = [e.gpus for e in entries]
    assert runs[0] == 1 and 3 in runs and runs[-1] == 1
    three = [e for e in entries if e.gpus == 3]
    assert three[0].interval_start >= up - dt.timedelta(seconds=1)
    assert sum((e.interval_end - e.interval_start for e in three), dt.timedelta()) <= clock - up + dt.timedelta(seconds=15)
    assert all(e.amount_usd == (Decimal(e.gpus) * e.usd_per_gpu_hour * Decimal(
        (e.interval_end - e.interval_start).total_seconds()) / 3600).quantize(Decimal("1e-9")) for e in entries)
    # the capacity figures' running allocation moved with each scale: what a rebuild from the ledger would write
    assert running.running_mismatches() == []


def test_a_scale_up_the_budget_refuses_leaves_the_size_and_says_why(serving_job, budget_factory, teams, owner):
    scaling = {"min_replicas": 1, "max_replicas": 2, "target_in_flight_per_replica": 1, "scale_up_delay_seconds": 0,
               "scale_down_delay_seconds": 300}
    attempt = serving_job(1, scaling)
    job = Job.objects.get(pk=attempt.job_id)
    # room for the running replica's estimate and half another: a second replica's is refused
    budget_factory(teams[0], str((job.estimated_cost_usd * Decimal("1.5")).quantize(Decimal("0.01"))))
    now = timezone.now()
    Cluster.objects.filter(pk=attempt.cluster_id).update(last_contact_at=now)
    autoscale(now)
    load = Load(attempt.runner_state["endpoint"], clients=3)
    wait_until(lambda: len(load.answers) >= 10, 30, "answers under load")
    [result] = autoscale(now + dt.timedelta(seconds=15))
    load.stop()
    assert result["desired"] == 2 and result["replicas"] == 1
    job.refresh_from_db()
    assert job.replicas == 1 and JobAttempt.objects.get(pk=attempt.pk).gpus == 1
    refusal = ServingScale.objects.get(job=job).refusal
    assert refusal["reason"] == "budget" and refusal["replicas"] == 1 and refusal["desired"] == 2
    event = JobEvent.objects.get(job=job, kind="scale_refused")
    assert event.reason.startswith("scale-up to 2 replicas refused: ") and "budget" in event.reason

    answer = owner.client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert answer["serving"]["replicas"] == 1
    assert answer["serving"]["autoscaling"]["refusal"]["message"] == refusal["message"]
    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()
    assert "Scale-up refused" in page and refusal["message"].split(":")[0] in page


def test_a_scale_up_is_booked_node_exactly_within_the_quota_and_refused_past_it(two_node_local_cluster, teams, user,
                                                                               catalog):
    sleeper = {"image": "python:3.11", "command": ["python", "-c", "import time; time.sleep(120)"], "env": {},
               "resources": {"accelerator": "H100-80GB", "gpus_per_node": 3, "nodes": 1}, "replicas": 1}
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name="serve", kind="inference", spec=sleeper,
                       gpus_per_node=3, max_runtime=3600)
    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    attempt = dispatched(JobAttempt.objects.get(pk=job.current_attempt_id))
    reconcile_until(attempt, {JobState.RUNNING})
    attempt.refresh_from_db()
    before = Job.objects.get(pk=job.pk).estimated_cost_usd
    now = timezone.now()

    assert add_replica(job.pk, now, {"desired": 2}) is None
    job.refresh_from_db()
    grown = JobAttempt.objects.get(pk=attempt.pk)
    assert job.replicas == 2 and grown.gpus == 6
    assert grown.placement["nodes"][0] == attempt.placement["nodes"][0] and len(grown.placement["nodes"]) == 2
    # the replica's estimate: 3 GPUs for the whole seconds left of the hour at the pool's price, rounded up to 1e-6
    left = math.floor(3600 - (now - grown.started_at).total_seconds())
    expected = (Decimal(3) * Decimal(left) * grown.usd_per_gpu_hour / 3600).quantize(Decimal("1e-6"), "ROUND_CEILING")
    assert job.estimated_cost_usd - before == expected

    refused = add_replica(job.pk, now, {"desired": 3})  # 9 GPUs: over alpha's 8-GPU quota
    assert refused.reason == "quota"
    assert refused.message.startswith("6 of 8 GPUs in use; 3 more would exceed the team's limit of 8 GPUs")
    assert Job.objects.get(pk=job.pk).replicas == 2 and JobAttempt.objects.get(pk=attempt.pk).gpus == 6

    assert release_replicas(job.pk, now, {"desired": 1}) == 1
    shrunk = JobAttempt.objects.get(pk=attempt.pk)
    assert shrunk.gpus == 3 and shrunk.placement["nodes"] == attempt.placement["nodes"]
    assert JobEvent.objects.filter(job_id=job.pk, kind="scale").count() == 2
