"""One reconcile pass over several emulated clusters: looked at concurrently; steady attempts write nothing.

The fixtures (three kmock emulators, a scheduler-admitted job factory) are
those of this folder's ``conftest.py``.
"""

from __future__ import annotations

from django.db import connection
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext

from jobs.models import JobEvent, JobState
from jobs.reconcile import reconcile_all
from jobs.tasks import dispatch_attempt
from runners.models import Cluster

from .steps import kubelet, start, state

S = JobState


def test_a_slow_cluster_does_not_hold_back_the_reconcile_of_the_others(emulated_clusters, admitted, settings):
    """aws-use1 (first by name) answers only once gcp-usc1's job was moved to RUNNING by the same pass.

    Were the clusters visited one after another, aws's LIST would wait for
    a change that comes after it: it would time out, aws would turn
    ``degraded`` and its job stay STARTING.
    """
    settings.K8S_READ_TIMEOUT_SECONDS = 30.0  # aws answers late, not never
    emulators, _ = emulated_clusters
    slow = admitted(placement={"clusters": ["aws-use1"]})
    fast = admitted(placement={"clusters": ["gcp-usc1"]})
    for attempt in (slow, fast):
        assert dispatch_attempt(attempt.pk) == "dispatched"
        k = kubelet(emulated_clusters, attempt)
        k.start_pods(k.job(attempt.pk))
    gate = emulators.hold("aws-use1")
    running_order = []

    def on_event(sender, instance: JobEvent, created: bool, **kwargs) -> None:
        if created and instance.to_state == S.RUNNING:
            running_order.append(instance.job_id)
            if instance.job_id == fast.job_id:
                held_when_fast_ran.append(gate.waiting)
                gate.release()

    held_when_fast_ran: list[int] = []
    post_save.connect(on_event, sender=JobEvent, weak=False)
    try:
        results = {r["cluster"]: r for r in reconcile_all()}
    finally:
        post_save.disconnect(on_event, sender=JobEvent)
        gate.release()

    assert running_order == [fast.job_id, slow.job_id]
    assert held_when_fast_ran == [1]  # aws's LIST was in flight, unanswered, when gcp's change was applied
    assert state(slow) == S.RUNNING and state(fast) == S.RUNNING
    assert Cluster.objects.get(name="aws-use1").health == "healthy"
    assert {name: r.get("observed") for name, r in results.items()} == {"aws-use1": 1, "azure-eastus": 0,
                                                                        "gcp-usc1": 1}


def test_an_unreachable_cluster_is_counted_while_the_others_are_reconciled(emulated_clusters, admitted):
    emulators, _ = emulated_clusters
    down = admitted(placement={"clusters": ["aws-use1"]})
    up = admitted(placement={"clusters": ["gcp-usc1"]})
    assert dispatch_attempt(down.pk) == "dispatched"
    k = kubelet(emulated_clusters, up)
    assert dispatch_attempt(up.pk) == "dispatched"
    k.start_pods(k.job(up.pk))
    emulators.stop("aws-use1")

    results = {r["cluster"]: r for r in reconcile_all()}

    assert results["aws-use1"]["unreachable"] and results["aws-use1"]["health"] == "degraded"
    assert results["gcp-usc1"]["observed"] == 1 and state(up) == S.RUNNING
    assert state(down) == S.STARTING  # one failed probe touches nothing


def test_a_steady_pass_writes_nothing_but_each_clusters_last_contact(emulated_clusters, admitted, settings):
    """Attempts whose phase does not change cost no write: the only writes of a pass that LISTs everything (every
    pass: nothing kept for looks between) are one health row per cluster."""
    settings.RECONCILE_FULL_LIST_SECONDS = 0
    for placement in ({"clusters": ["aws-use1"]}, {"clusters": ["gcp-usc1"]}, {"clusters": ["gcp-usc1"]}):
        start(emulated_clusters, admitted(placement=placement))
    reconcile_all()

    with CaptureQueriesContext(connection) as captured:
        results = reconcile_all()

    assert sum(r["observed"] for r in results) == 3
    writes = [q["sql"] for q in captured.captured_queries
              if q["sql"].lstrip().split()[0].upper() in ("INSERT", "UPDATE", "DELETE")]
    assert len(writes) == 3 and all(sql.startswith('UPDATE "runners_cluster"') for sql in writes), writes


def test_kmock_clusters_serve_changes_since_a_resource_version(emulated_clusters, admitted, settings):
    """The kmock emulators keep resource versions: a look between full LISTs gets, by watch, only the pod a kubelet
    changed since the last look, and ends its job; once the emulator forgot its changes (compaction) the watch
    answers 410 Gone and the look LISTs everything."""
    settings.RECONCILE_FULL_LIST_SECONDS = 3600
    emulators, _ = emulated_clusters
    finishing, staying = (admitted(placement={"clusters": ["gcp-usc1"]}) for _ in range(2))
    pods = {}
    for attempt in (finishing, staying):
        _, _, pods[attempt.pk] = start(emulated_clusters, attempt)
    steady = reconcile_all()
    assert {r["cluster"]: (r["full_list"], r["observed"]) for r in steady}["gcp-usc1"] == (False, 0)

    kubelet(emulated_clusters, finishing).terminate(pods[finishing.pk][0], exit_code=0)
    kubelet(emulated_clusters, finishing).finish_job(kubelet(emulated_clusters, finishing).job(finishing.pk),
                                                     "Complete")
    changed = {r["cluster"]: r for r in reconcile_all()}["gcp-usc1"]
    assert (changed["full_list"], changed["observed"], changed["changed"]) == (False, 1, 1)
    assert (state(finishing), state(staying)) == (S.SUCCEEDED, S.RUNNING)

    emulators.fronts["gcp-usc1"].compact()
    relisted = {r["cluster"]: r for r in reconcile_all()}["gcp-usc1"]
    assert relisted["full_list"] is True and relisted.get("unreachable") is None
    assert relisted["observed"] == 1 and state(staying) == S.RUNNING
