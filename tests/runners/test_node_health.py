"""Node health end to end: DCGM health series in a real Prometheus (TSDB built by ``promtool``) and Kubernetes nodes in
the emulator; the health check marks nodes with the evidence, admission keeps off unhealthy ones with a wait reason
that names them, work on a node that goes bad is recovered elsewhere naming the node, and staff clear and cordon.

The expected health of each node is read off the reference list of XIDs (``docs/reference/gpu-health.md``: 48,
63/64, 74, 79, 94/95 point at the hardware; 13, 31, 43 at the application), not from the code under test.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest

from jobs.models import JobAttempt, JobEvent, JobState
from jobs.reconcile import reconcile_cluster
from jobs.scheduling.passes import schedule_pending
from runners import health
from runners.kubernetes.sync import sync_cluster
from runners.models import Node
from tests.runners.kubernetes.test_node_exact_admission import (  # noqa: F401 (two_clusters is a fixture)
    add,
    dispatch_and_schedule,
    gpu_node,
    submit,
    two_clusters,
)
from tests.support.factories import fresh
from tests.support.kubernetes import Kubelet
from tests.support.prometheus import start_prometheus

T0 = dt.datetime(2026, 5, 4, 12, 0, tzinfo=UTC)  # the XIDs appear at T0
MIN = dt.timedelta(minutes=1)
BEFORE, AFTER, LATER = T0 - 30 * MIN, T0 + 5 * MIN, T0 + 25 * MIN  # LATER: GPU 3 of node a shows XID 48 instead


def series(t0: dt.datetime, t1: dt.datetime, value) -> list[tuple[float, float]]:
    """One sample a minute in ``[t0, t1)``."""
    out, t = [], t0
    while t < t1:
        out.append((t.timestamp(), value))
        t += MIN
    return out


def dcgm_text() -> str:
    """The OpenMetrics text of the scenario: per (metric, cluster, node, GPU) its samples from T0 - 1 h to T0 + 1 h."""
    start, end = T0 - 60 * MIN, T0 + 60 * MIN
    xid = "DCGM_FI_DEV_XID_ERRORS"
    scenario = {  # (metric, cluster, node, gpu): samples
        (xid, "cheap", "a", 3): series(start, T0, 0) + series(T0, T0 + 15 * MIN, 79) + series(T0 + 15 * MIN, end, 48),
        (xid, "cheap", "b", 0): series(start, end, 13),  # the application's fault
        (xid, "cheap", "s", 1): series(start, T0, 0) + series(T0, end, 119),  # not a hardware XID of the list
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "cheap", "c", 5): series(start, T0, 0) + series(T0, end, 1),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "cheap", "e", 2): series(start, T0, 0) + series(T0, end, 2),
        (xid, "other", "d0", 0): series(start, end, 79),  # another cluster's node of the same name as dear's
    }
    for node in ("a", "b", "c", "e", "s", "d0"):  # every other GPU reports 0 all along
        for gpu in range(8):
            for metric in (xid, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"):
                if not any(k[0] == metric and k[2] == node and k[3] == gpu for k in scenario):
                    scenario[(metric, "cheap" if node != "d0" else "dear", node, gpu)] = series(start, end, 0)
    families: dict[str, list[str]] = {}
    for (metric, cluster, node, gpu), samples in sorted(scenario.items()):
        labels = (f'{{gpu="{gpu}",UUID="GPU-{node}-{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",'
                  f'cluster="{cluster}"}}')
        families.setdefault(metric, []).extend(f"{metric}{labels} {v:g} {t:.3f}" for t, v in samples)
    lines = []
    for metric, rows in families.items():
        lines += [f"# TYPE {metric} gauge", *rows]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def dcgm_health_prometheus(tmp_path_factory) -> str:
    proc, url = start_prometheus(tmp_path_factory.mktemp("dcgm-health"), dcgm_text())
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def fleet(two_clusters, settings, dcgm_health_prometheus):  # noqa: F811 (the imported fixture, by name)
    """The two emulated clusters (cheap at 2.00, dear at 9.00 USD/GPU-h) read from the DCGM Prometheus (one for
    both, a ``cluster`` label each); ``(emulators, clusters)``."""
    settings.COSTS_PROMETHEUS_URL = dcgm_health_prometheus
    settings.NODE_HEALTH_LOOKBACK_SECONDS = 600
    return two_clusters


def nodes(cluster) -> dict[str, Node]:
    return {n.name: n for n in Node.objects.filter(cluster=cluster)}


def test_dcgm_errors_mark_each_node_by_what_its_xid_or_counter_points_at(fleet):
    emulators, clusters = fleet
    add(emulators, "cheap", *[gpu_node(n) for n in ("a", "b", "c", "e", "s")])
    add(emulators, "dear", gpu_node("d0"))
    for c in clusters.values():
        sync_cluster(c)
    before = health.check_cluster(clusters["cheap"], now=BEFORE)
    assert (before["dcgm"], before["suspect"], before["unhealthy"]) == ("read", 0, 0)
    assert {n.health for n in nodes(clusters["cheap"]).values()} == {"healthy"}

    result = health.check_cluster(clusters["cheap"], now=AFTER)
    health.check_cluster(clusters["dear"], now=AFTER)
    rows = nodes(clusters["cheap"])
    expected = {"a": "unhealthy", "b": "healthy", "c": "unhealthy", "e": "unhealthy", "s": "suspect"}
    assert {name: n.health for name, n in rows.items()} == expected
    assert (result["unhealthy"], result["suspect"]) == (3, 1)
    assert [(e["source"], e["signal"], e["gpu"], e["value"]) for e in rows["a"].health_evidence] == [
        ("dcgm", "xid", "3", 79)]
    assert "XID 79" in rows["a"].health_evidence[0]["message"] and "GPU-a-3" in rows["a"].health_evidence[0]["message"]
    assert rows["c"].health_evidence[0]["signal"] == "row_remap_failure"
    assert (rows["e"].health_evidence[0]["signal"], rows["e"].health_evidence[0]["value"]) == ("ecc_dbe", 2.0)
    assert rows["b"].health_evidence == []  # XID 13 is the application's
    # dear's d0 is healthy: the XID 79 of a node named d0 belongs to another cluster's series
    assert nodes(clusters["dear"])["d0"].health == "healthy"


def test_xid_errors_on_one_node_in_prometheus_keep_a_job_off_it(fleet, teams, user, catalog):
    # cheap (2.00 USD/GPU-h) has node a, free but with XID 79 on GPU 3; dear (9.00) has d0, free.
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("a"))
    add(emulators, "dear", gpu_node("d0"))
    for c in clusters.values():
        sync_cluster(c)
        health.check_cluster(c, now=AFTER)
    first = submit(teams, user, catalog)
    schedule_pending()
    attempt = fresh(first).current_attempt
    assert (attempt.cluster.name, attempt.placement["nodes"]) == ("dear", ["d0"])
    second = submit(teams, user, catalog)
    schedule_pending()
    waiting = fresh(second)
    assert waiting.state == JobState.QUEUED and waiting.queue_info["reason"] == "capacity"
    message = waiting.queue_info["message"]
    assert "1 large enough node is unhealthy and left out" in message and "/a" in message


def test_a_suspect_node_takes_work_only_when_no_healthy_node_of_the_pool_fits(fleet, teams, user, catalog):
    # cheap has s (XID 119: suspect) and t (no evidence), both free; s is first by name, so it would be taken
    # first were it healthy. dear is gone: cheap is the only pool.
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("s"), gpu_node("t"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    health.check_cluster(clusters["cheap"], now=AFTER)
    assert {n.name: n.health for n in nodes(clusters["cheap"]).values()} == {"s": "suspect", "t": "healthy"}
    first = submit(teams, user, catalog)
    schedule_pending()
    assert fresh(first).current_attempt.placement["nodes"] == ["t"]
    second = submit(teams, user, catalog)  # t is full now: only the suspect node fits
    schedule_pending()
    assert fresh(second).current_attempt.placement["nodes"] == ["s"]


def test_a_running_job_on_a_node_that_goes_bad_is_recovered_elsewhere_naming_the_node(fleet, teams, user, catalog,
                                                                                     owner):
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("a"), gpu_node("b"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    health.check_cluster(clusters["cheap"], now=BEFORE)  # no XID yet
    job = submit(teams, user, catalog)  # max_retries 0: a retry used would fail it
    schedule_pending()
    attempt = fresh(job).current_attempt
    assert attempt.placement["nodes"] == ["a"]  # two equal free nodes: the first by name
    dispatch_and_schedule(emulators, "cheap", attempt)
    reconcile_cluster(clusters["cheap"])
    assert fresh(job).state == JobState.RUNNING

    result = health.check_cluster(clusters["cheap"], now=AFTER)  # XID 79 on GPU 3 of a
    assert result["recovered"] == 1
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    job = fresh(job)
    assert job.state == JobState.RECOVERING
    assert (attempt.end_reason, attempt.bad_nodes) == (JobAttempt.EndReason.NODE_UNHEALTHY, ["a"])
    event = JobEvent.objects.filter(job=job, to_state=JobState.RECOVERING).get()
    assert "node a of cheap is unhealthy" in event.reason and "XID 79" in event.reason
    (shown,) = owner.client.get(f"/api/v1/jobs/{job.pk}/attempts/").json()["results"]
    assert (shown["end_reason"], shown["nodes"], shown["bad_nodes"]) == ("NodeUnhealthy", ["a"], ["a"])
    schedule_pending()
    job = fresh(job)
    assert job.state == JobState.ADMITTED and job.current_attempt.placement["nodes"] == ["b"]


def test_staff_clear_forgets_the_xid_seen_but_not_a_new_one(fleet):
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("a"))
    sync_cluster(clusters["cheap"])
    health.check_cluster(clusters["cheap"], now=AFTER)
    node = Node.objects.get(cluster=clusters["cheap"], name="a")
    assert node.health == "unhealthy"
    health.clear(node)
    health.check_cluster(clusters["cheap"], now=AFTER + 5 * MIN)  # the gauge still says 79: cleared
    assert Node.objects.get(pk=node.pk).health == "healthy"
    health.check_cluster(clusters["cheap"], now=LATER)  # the gauge now says 48: a new error
    node = Node.objects.get(pk=node.pk)
    assert node.health == "unhealthy" and node.health_evidence[0]["value"] == 48


def test_a_prometheus_that_does_not_answer_keeps_the_gpu_evidence(fleet, settings):
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("a"))
    sync_cluster(clusters["cheap"])
    health.check_cluster(clusters["cheap"], now=AFTER)
    settings.COSTS_PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing listens there
    settings.COSTS_PROMETHEUS_TIMEOUT_SECONDS = 1
    result = health.check_cluster(clusters["cheap"], now=LATER)
    assert result["dcgm"] != "read"
    node = Node.objects.get(cluster=clusters["cheap"], name="a")
    assert node.health == "unhealthy" and node.health_evidence[0]["value"] == 79


def test_a_problem_condition_makes_a_node_suspect_and_it_still_takes_work(fleet, teams, user, catalog):
    emulators, clusters = fleet
    sick = gpu_node("p")
    sick["status"]["conditions"].append({"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                                         "message": "task docker:7 blocked for more than 120 seconds"})
    sick["status"]["conditions"].append({"type": "MemoryPressure", "status": "False"})
    add(emulators, "cheap", sick)
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    health.check_cluster(clusters["cheap"], now=AFTER)
    node = Node.objects.get(cluster=clusters["cheap"], name="p")
    assert node.problem_conditions == [{"type": "KernelDeadlock", "reason": "DockerHung",
                                        "message": "task docker:7 blocked for more than 120 seconds"}]
    assert node.health == "suspect" and "KernelDeadlock" in node.health_evidence[0]["message"]
    job = submit(teams, user, catalog)
    schedule_pending()
    assert fresh(job).current_attempt.placement["nodes"] == ["p"]


def test_attempts_lost_with_their_node_name_it_and_count_against_it(fleet, teams, user, catalog, settings):
    settings.NODE_HEALTH_UNHEALTHY_AFTER_FAILURES = 2
    settings.COSTS_PROMETHEUS_URL = ""  # history only
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("h"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    for round_ in (1, 2):
        job = submit(teams, user, catalog)
        schedule_pending()
        attempt = fresh(job).current_attempt
        assert attempt.placement["nodes"] == ["h"]
        dispatch_and_schedule(emulators, "cheap", attempt)
        reconcile_cluster(clusters["cheap"])
        pod = Kubelet(emulators.url("cheap")).pods(attempt.pk)[0]
        emulators_node_lost(emulators, pod)
        reconcile_cluster(clusters["cheap"])
        attempt = JobAttempt.objects.get(pk=attempt.pk)
        assert (attempt.end_reason, attempt.bad_nodes) == (JobAttempt.EndReason.NODE_LOST, ["h"])
        assert "lost on node h" in fresh(job).state_reason
        health.check_cluster(clusters["cheap"])
        node = Node.objects.get(cluster=clusters["cheap"], name="h")
        assert node.health == ("suspect" if round_ == 1 else "unhealthy")
        assert node.health_evidence[0]["value"] == round_
    health.clear(node)
    health.check_cluster(clusters["cheap"])
    assert Node.objects.get(pk=node.pk).health == "healthy"  # attempts ended before the clear no longer count


def emulators_node_lost(emulators, pod: dict) -> None:
    """Mark ``pod`` as the pod garbage collector does when its node is deleted (DisruptionTarget DeletionByPodGC)."""
    k = Kubelet(emulators.url("cheap"))
    now = dt.datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    k.patch_pod(pod, {"phase": "Failed", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
         "message": "PodGC: node no longer exists", "lastTransitionTime": now}]})


def test_a_training_attempt_that_fails_on_an_unhealthy_node_is_placed_again(fleet, teams, user, catalog):
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("a"), gpu_node("b"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    job = submit(teams, user, catalog)
    schedule_pending()
    attempt = fresh(job).current_attempt
    dispatch_and_schedule(emulators, "cheap", attempt)
    reconcile_cluster(clusters["cheap"])
    node = Node.objects.get(cluster=clusters["cheap"], name=attempt.placement["nodes"][0])
    # The health check marked the node but a reconcile sees the crash before its attempts are recovered.
    health.store_health(node, "unhealthy", [health.finding("dcgm", "xid", "unhealthy", "GPU 3: XID 79 (GPU has "
                                                           "fallen off the bus)", key="dcgm:xid:GPU-x", value=79)],
                        AFTER)
    pod = Kubelet(emulators.url("cheap")).pods(attempt.pk)[0]
    Kubelet(emulators.url("cheap")).terminate(pod, 1, "Error")
    reconcile_cluster(clusters["cheap"])
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    job = fresh(job)
    assert job.state == JobState.RECOVERING and attempt.end_reason == JobAttempt.EndReason.NODE_UNHEALTHY
    assert attempt.bad_nodes == [node.name] and f"unhealthy node {node.name}" in job.state_reason


def test_a_node_cordoned_by_staff_takes_no_work_until_uncordoned(fleet, teams, user, catalog, staff):
    emulators, clusters = fleet
    add(emulators, "cheap", gpu_node("a"))
    sync_cluster(clusters["cheap"])
    clusters["dear"].delete()
    node = health.cordon(Node.objects.get(cluster=clusters["cheap"], name="a"), staff.user, "reseating GPU 3")
    assert node.cordon_note == f"by {staff.user.username}: reseating GPU 3"
    job = submit(teams, user, catalog)
    schedule_pending()
    assert fresh(job).state == JobState.QUEUED and "cordoned" in fresh(job).queue_info["message"]
    health.uncordon(node)
    schedule_pending()
    assert fresh(job).current_attempt.placement["nodes"] == ["a"]
