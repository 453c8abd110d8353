"""``billed_once`` can fail both ways: on constructed pods and ledgers, it flags a ledger short of time the platform
was shown and a ledger longer than the pods held; it lets pass only the time no answer showed. And the emulated
cluster records what its answers showed: a pod listed while it runs, its owner's deletion accepted, not what a
cut answer carried."""

from __future__ import annotations

import json
import urllib.request
from decimal import Decimal

import pytest

from tests.support.kubernetes import ClusterEmulator, Fault
from tests.support.simulation.invariants import BILLING_TOLERANCE_SECONDS, PodHold, billing_violation

GPUS = 8
LOOK = 5.0  # one reconcile interval, seconds


def gpu_seconds(seconds: float) -> Decimal:
    return Decimal(GPUS) * Decimal(str(seconds))


# Two pods of a gang created at 1000 s, stopped at 1100 s; the platform's last evidence at 1060 s (their grace ran
# out unwatched from there).
GANG = [PodHold(1000.0, 1100.0, 1060.0), PodHold(1000.0, 1090.0, 1050.0)]


@pytest.mark.parametrize("billed", [60.0, 60.0 - LOOK, 100.0])
def test_a_ledger_between_the_shown_time_and_the_real_time_passes(billed):
    assert billing_violation(GPUS, gpu_seconds(billed), GANG, limit=None, look=LOOK) is None


def test_a_ledger_short_of_time_the_platform_was_shown_fails():
    short = 60.0 - LOOK - 2 * float(BILLING_TOLERANCE_SECONDS)
    why = billing_violation(GPUS, gpu_seconds(short), GANG, limit=None, look=LOOK)
    assert why is not None and why.startswith("under-billed")


def test_a_ledger_short_of_a_finish_the_platform_read_fails():
    """The platform read the pods' own finish (shown until their stop): no part of the span may go unbilled."""
    read = [PodHold(1000.0, 1100.0, 1100.0)]
    assert billing_violation(GPUS, gpu_seconds(100.0 - LOOK), read, limit=None, look=LOOK) is None
    why = billing_violation(GPUS, gpu_seconds(80.0), read, limit=None, look=LOOK)
    assert why is not None and why.startswith("under-billed")


def test_a_ledger_past_the_pods_real_stop_fails_even_when_nothing_was_shown():
    unseen = [PodHold(1000.0, 1100.0, None)]
    assert billing_violation(GPUS, gpu_seconds(0.0), unseen, limit=None, look=LOOK) is None
    why = billing_violation(GPUS, gpu_seconds(100.0 + 2 * float(BILLING_TOLERANCE_SECONDS)), unseen, limit=None,
                            look=LOOK)
    assert why is not None and why.startswith("over-billed")


def test_the_max_runtime_caps_both_bounds():
    read = [PodHold(1000.0, 1100.0, 1100.0)]
    assert billing_violation(GPUS, gpu_seconds(50.0), read, limit=50, look=LOOK) is None
    why = billing_violation(GPUS, gpu_seconds(60.0), read, limit=50, look=LOOK)
    assert why is not None and why.startswith("over-billed")


def test_an_attempt_without_pods_may_bill_nothing_but_its_tolerance():
    assert billing_violation(GPUS, Decimal(0), [], limit=None, look=LOOK) is None
    assert billing_violation(GPUS, gpu_seconds(10.0), [], limit=None, look=LOOK) is not None


def call(emulator: ClusterEmulator, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(emulator.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "labels": {"app": "t"}},
       "spec": {"completions": 1, "parallelism": 1, "completionMode": "Indexed", "backoffLimit": 0,
                "template": {"metadata": {"labels": {"app": "t"}}, "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}
PODS = "/api/v1/namespaces/ns/pods"


def test_the_emulator_records_what_its_answers_showed_of_a_pod():
    with ClusterEmulator("c") as emulator:
        emulator.add_node("n1", 8)
        assert call(emulator, "POST", "/api/v1/namespaces", {"metadata": {"name": "ns"}})[0] == 201
        assert call(emulator, "POST", "/apis/batch/v1/namespaces/ns/jobs", JOB)[0] == 201
        (uid,) = emulator.pod_times
        assert emulator.pod_shown.get(uid) is None  # created by the Job controller: no answer showed it yet

        status, _ = call(emulator, "GET", PODS)
        assert status == 200
        listed = emulator.pod_shown[uid][0]
        assert listed is not None and emulator.pod_shown[uid][1] is None

        emulator.inject(Fault("truncated", method="GET", count=1))
        call(emulator, "GET", PODS)
        assert emulator.pod_shown[uid][0] == listed  # a cut answer showed nothing

        emulator.termination_grace = 30.0
        status, _ = call(emulator, "DELETE", "/apis/batch/v1/namespaces/ns/jobs/train")
        assert status == 200
        accepted = emulator.pod_shown[uid][1]
        assert accepted is not None and accepted >= listed
        assert emulator.pod_times[uid][3] is None  # still running out its grace: holding, beyond what was shown

        assert call(emulator, "DELETE", "/apis/batch/v1/namespaces/ns/jobs/train")[0] == 200
        assert emulator.pod_shown[uid][1] == accepted  # a second DELETE shows the first's deletionTimestamp
