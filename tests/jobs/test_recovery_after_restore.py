"""A restore of the database from a backup kills, doubles or mis-bills no work (ADR 0011).

The operator's disaster, on PostgreSQL with two emulated clusters: an online
``pg_dump -Fc`` while three jobs run; three more start, one of the first
finishes, one is cancelled; the database is restored with ``pg_restore
--clean``; ``manage.py after_restore`` runs, then the periodic tasks. Nothing
running is deleted or started twice, every job started after the backup is
adopted, the finished and cancelled ones end as they did, quota and free
capacity equal what the clusters run, the ledger of the gap equals the
pods' own GPU time with every rebuilt entry flagged, and a job submitted
after the restore collides with nothing.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import subprocess
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import ProgrammingError, connection, connections
from django.utils import timezone

from costs.ledger import accrue_running
from costs.models import CostEntry
from costs.rollups import totals_mismatches
from jobs import reconcile
from jobs.lifecycle import cancel_job, dispatch, finish_cancel
from jobs.models import Job, JobAttempt, JobState
from jobs.reconcile import expire_end_records, reconcile_all
from jobs.recovery import decide
from jobs.scheduling.snapshot import team_used_gpus
from quotas.audit import record, snapshot
from quotas.models import AuditRecord, Team
from runners.api.serializers import pool_statuses
from runners.kubernetes.manifests import LABEL_ATTEMPT_UID
from runners.models import Installation, NodePool, installation
from tests.support.clusters import load

pytestmark = pytest.mark.django_db(transaction=True)
S = JobState


def pg_args() -> list[str]:
    """Connection options of the test database for the PostgreSQL client tools."""
    db = connection.settings_dict
    return ["-h", db["HOST"] or "127.0.0.1", "-p", str(db["PORT"] or 5432), "-U", db["USER"] or "postgres",
            "-d", db["NAME"]]


def backup(path) -> None:
    """An online ``pg_dump -Fc`` of the test database (the platform keeps its connections open). The
    installation's row is in it, as its migration made it in production (a flushed test database lacks it)."""
    installation()
    subprocess.run(["pg_dump", "-Fc", "-f", str(path), *pg_args()], check=True, capture_output=True, timeout=120)


def restore(path) -> None:
    """Drop and restore every table from ``path`` (``pg_restore --clean``), with no connection of ours open."""
    connections.close_all()
    subprocess.run(["pg_restore", "--clean", "--if-exists", "--single-transaction", "--no-owner", *pg_args(),
                    str(path)], check=True, capture_output=True, timeout=120)


def start(world, cluster: str) -> JobAttempt:
    """A 2-GPU job of team alpha admitted to ``cluster``, dispatched and seen running; its attempt."""
    attempt = world.admit(cluster=cluster, nodes=1, gpus=2)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile(cluster)
    assert Job.objects.get(pk=attempt.job_id).state == S.RUNNING
    return load(attempt.pk)


def pod_seconds(world, uid: str, lo: float, hi: float) -> float:
    """GPU-seconds the clusters' pods of attempt ``uid`` held within ``[lo, hi)`` (the emulators' own times)."""
    total = 0.0
    for emulator in world.emulators.values():
        for gpus, labels, created, stopped in emulator.pod_times.values():
            if labels.get(LABEL_ATTEMPT_UID) == uid:
                total += gpus * max(0.0, min(stopped or hi, hi) - max(created, lo))
    return total


def running_gpus(world) -> dict[str, int]:
    """GPUs held by pods that run now, per cluster name."""
    return {name: sum(int(c["resources"]["limits"]["nvidia.com/gpu"]) for p in e.pods()
                      if p["status"].get("phase") in ("Pending", "Running") and not p["metadata"].get(
                          "deletionTimestamp") for c in p["spec"]["containers"])
            for name, e in world.emulators.items()}


def workloads(world) -> dict[str, int]:
    """Jobs and Deployments on the clusters, counted per attempt uid."""
    counts: dict[str, int] = {}
    for emulator in world.emulators.values():
        for kind in ("Job", "Deployment"):
            for obj in emulator.objects(kind):
                uid = obj["metadata"]["labels"][LABEL_ATTEMPT_UID]
                counts[uid] = counts.get(uid, 0) + 1
    return counts


def test_a_restore_from_a_backup_adopts_what_runs_and_ends_what_ended(live_clusters, tmp_path):
    world = live_clusters
    team, accelerator = world.team.pk, world.accelerator.pk
    finished, cancelled, kept = (start(world, name) for name in ("aws-use1", "gcp-usc1", "aws-use1"))
    accrue_running()
    audited = Team.objects.get(pk=team)
    kept_record = record(None, "updated", audited, snapshot(audited), snapshot(audited), "before the backup")
    backup(tmp_path / "cp.dump")
    time.sleep(1.0)
    lost_record = record(None, "updated", audited, snapshot(audited), snapshot(audited), "after the backup")

    later = [start(world, name) for name in ("gcp-usc1", "aws-use1", "gcp-usc1")]
    before = {a.pk: str(a.uid) for a in [finished, cancelled, kept, *later]}
    time.sleep(1.0)
    aws = world.emulators["aws-use1"]
    aws.finish_pod(aws.pods(finished.pk)[0]["metadata"]["name"], 0)
    cancel_job(Job.objects.get(pk=cancelled.job_id))
    assert finish_cancel(cancelled.job_id)
    reconcile_all()
    assert Job.objects.get(pk=finished.job_id).state == S.SUCCEEDED
    assert aws.objects("Job", finished.pk) == []  # its objects were cleaned up: only its end record is left
    accrue_running()
    time.sleep(1.0)
    deletions = {name: len(e.deletions) for name, e in world.emulators.items()}
    running = workloads(world)
    assert set(running) == {str(a.uid) for a in [kept, *later]}

    restore(tmp_path / "cp.dump")
    assert not JobAttempt.objects.filter(uid__in=[str(a.uid) for a in later]).exists()  # lost with the gap
    # The audit trail is part of the backup: the record of before it is back as it was, the later one is gone
    # with the change it described, and the restored table still refuses changes (ADR 0031).
    assert list(AuditRecord.objects.filter(pk__in=[kept_record.pk, lost_record.pk]).values_list("pk", "reason")) \
        == [(kept_record.pk, "before the backup")]
    with pytest.raises(ProgrammingError, match="append-only"), connection.cursor() as cursor:
        cursor.execute("UPDATE quotas_auditrecord SET reason = 'rewritten' WHERE id = %s", [kept_record.pk])
    boundary = {str(a.uid): a.accrued_until.timestamp() for a in JobAttempt.objects.all()}
    assert set(boundary) == {str(finished.uid), str(cancelled.uid), str(kept.uid)}

    out = io.StringIO()
    call_command("after_restore", stdout=out)
    report = json.loads(out.getvalue())
    restored_at = Installation.objects.get().restored_at
    assert sorted(a["uid"] for a in report["adopted"]) == sorted(str(a.uid) for a in later)
    assert report["listed_for_staff"] == [] and report["totals_mismatches"] == 0

    # The ledger of the gap: each attempt's rebuilt entries hold exactly what its pods held since the restored
    # ledger stopped, up to the restore, to the second; every one of them is flagged, and nothing else is.
    for uid in before.values():
        attempt = JobAttempt.objects.get(uid=uid)
        entries = list(CostEntry.objects.filter(attempt=attempt))
        rebuilt = [e for e in entries if e.reconstructed]
        lo = boundary.get(uid, 0.0)
        assert sum(e.gpu_seconds for e in rebuilt) == pytest.approx(
            pod_seconds(world, uid, lo, restored_at.timestamp()), abs=1.0)
        assert all(e.interval_end.timestamp() <= lo for e in entries if not e.reconstructed)
        assert all(e.interval_start.timestamp() >= lo for e in rebuilt) and rebuilt
    assert totals_mismatches() == []

    # The periodic tasks, twice (an absent attempt needs two looks).
    for _ in range(2):
        reconcile_all()
        accrue_running()

    assert JobAttempt.objects.get(uid=before[finished.pk]).job.state == S.SUCCEEDED
    assert JobAttempt.objects.get(uid=before[cancelled.pk]).job.state == S.CANCELLED
    for attempt in [kept, *later]:
        row = JobAttempt.objects.select_related("job").get(uid=attempt.uid)
        assert row.job.state == S.RUNNING and row.ended_at is None and row.job.current_attempt_id == row.pk
        assert row.adopted_after_restore == (attempt in later)
        assert row.pk == attempt.pk and row.job_id == attempt.job_id  # the ids its objects carry, kept
        assert row.started_at == attempt.started_at
    assert JobAttempt.objects.count() == 6  # nothing restarted
    assert {name: len(e.deletions) for name, e in world.emulators.items()} == deletions  # nothing deleted
    assert workloads(world) == running  # nothing started twice

    used = running_gpus(world)
    assert team_used_gpus(team, accelerator) == sum(used.values()) == 8
    for pool in NodePool.objects.select_related("cluster"):
        assert pool_statuses([pool])[pool.pk].free_gpus == pool.capacity_gpus - used[pool.cluster.name]
    assert totals_mismatches() == []

    # A job submitted after the restore gets a new id and a name no object has, and runs.
    fresh = world.admit(cluster="aws-use1", nodes=1, gpus=2)
    assert fresh.job_id > max(a.job_id for a in [finished, cancelled, kept, *later])
    assert fresh.pk > max(before)
    assert dispatch(fresh.pk) == "dispatched"
    world.reconcile("aws-use1")
    assert Job.objects.get(pk=fresh.job_id).state == S.RUNNING
    assert workloads(world) == {**running, str(fresh.uid): 1}
    for attempt in later:
        assert JobAttempt.objects.get(uid=attempt.uid).job.state == S.RUNNING


def test_an_attempt_gone_without_an_end_record_waits_for_staff_after_a_restore(live_clusters, tmp_path):
    world = live_clusters
    lost = start(world, "gcp-usc1")
    backup(tmp_path / "cp.dump")
    gcp = world.emulators["gcp-usc1"]
    with gcp.lock:  # deleted behind the platform's back: no end record
        gcp._delete("Job", (lost.runner_state["namespace"], lost.object_name), cascade=True)
    restore(tmp_path / "cp.dump")

    call_command("after_restore", stdout=io.StringIO())
    for _ in range(3):
        reconcile_all()

    job = Job.objects.get(pk=lost.job_id)
    assert job.state == S.RUNNING and JobAttempt.objects.filter(job=job).count() == 1  # not restarted
    held = job.events.get(kind="held_after_restore")
    assert "staff decision" in held.reason

    assert decide(job.pk, "fail") == "failed"
    job.refresh_from_db()
    assert job.state == S.FAILED and gcp.objects("Job") == []
    assert timezone.now() >= job.ended_at


def test_end_records_stay_for_their_retention_then_go(live_clusters, settings):
    world = live_clusters
    attempt = start(world, "aws-use1")
    cancel_job(Job.objects.get(pk=attempt.job_id))
    assert finish_cancel(attempt.job_id)
    aws = world.emulators["aws-use1"]
    [record] = aws.objects("ConfigMap")
    assert record["metadata"]["name"] == f"end-{attempt.object_name}"
    assert record["data"]["job_state"] == S.CANCELLED and record["data"]["uid"] == str(attempt.uid)

    reconcile.LAST_SWEEP.clear()
    assert expire_end_records() == 0 and len(aws.objects("ConfigMap")) == 1  # within its retention: kept
    reconcile.LAST_SWEEP.clear()
    later = timezone.now() + dt.timedelta(seconds=settings.END_RECORD_RETENTION_SECONDS + 1)
    assert expire_end_records(later) == 1 and aws.objects("ConfigMap") == []


def test_an_attempt_made_before_uids_is_still_matched_by_its_id(live_clusters):
    world = live_clusters
    attempt = world.admit(cluster="gcp-usc1", nodes=1, gpus=2)
    legacy = f"job-{attempt.job_id}-{attempt.number}"
    JobAttempt.objects.filter(pk=attempt.pk).update(object_name=legacy)
    assert dispatch(attempt.pk) == "dispatched"
    gcp = world.emulators["gcp-usc1"]
    [job] = gcp.objects("Job", attempt.pk)
    assert job["metadata"]["name"] == legacy and LABEL_ATTEMPT_UID not in job["metadata"]["labels"]

    world.reconcile("gcp-usc1")
    assert Job.objects.get(pk=attempt.job_id).state == S.RUNNING
    gcp.finish_pod(gcp.pods(attempt.pk)[0]["metadata"]["name"], 0)
    result = world.reconcile("gcp-usc1")
    assert Job.objects.get(pk=attempt.job_id).state == S.SUCCEEDED
    assert result["orphans_deleted"] == 1 and result["unknown"] == 0 and gcp.objects("Job") == []


def test_what_cannot_be_adopted_is_listed_for_staff_and_left_running(live_clusters, tmp_path, django_user_model):
    world = live_clusters
    backup(tmp_path / "cp.dump")
    world.user = django_user_model.objects.create_user("newcomer")  # joined after the backup: lost with it
    unknown = start(world, "aws-use1")
    restore(tmp_path / "cp.dump")

    out = io.StringIO()
    with pytest.raises(CommandError, match="not complete"):
        call_command("after_restore", stdout=out)
    report = json.loads(out.getvalue())
    assert report["adopted"] == []
    [listed] = report["listed_for_staff"]
    assert listed["uid"] == str(unknown.uid) and "submitter" in listed["why"] and listed["cluster"] == "aws-use1"
    reconcile_all()
    aws = world.emulators["aws-use1"]
    assert aws.deletions == [] and len(aws.objects("Job")) == 1  # untouched
    assert not JobAttempt.objects.filter(uid=unknown.uid).exists()


def _array_of_four(world):
    """An array of 4 two-GPU elements of alpha on aws-use1, at most 2 at once (``submit_array``, as the API
    stores it); the array."""
    from jobs.arrays import submit_array

    spec = {"image": "registry.example/t:1", "command": ["python", "train.py"],
            "resources": {"accelerator": world.accelerator.name, "gpus_per_node": 2, "nodes": 1},
            "placement": {"clusters": ["aws-use1"]}, "max_runtime_seconds": 3600}
    resources = {"accelerator": world.accelerator, "gpus_per_node": 2, "nodes": 1, "priority": 0,
                 "preemptible": False, "max_runtime_seconds": 3600, "max_retries": 0}
    return submit_array(team=world.team, submitter=world.user, name="sweep", kind="training", spec=spec,
                        resources=resources, count=4, parallelism=2, grid=[])


def _run_now(world, job_id: int) -> JobAttempt:
    """Admit job ``job_id`` (QUEUED), dispatch it and see it RUNNING; its attempt."""
    from jobs.scheduling.passes import try_admit

    assert try_admit(job_id) == "admitted", Job.objects.get(pk=job_id).queue_info
    attempt = load(Job.objects.get(pk=job_id).current_attempt_id)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile(attempt.cluster.name)
    assert Job.objects.get(pk=job_id).state == S.RUNNING
    return load(attempt.pk)


def test_work_started_in_the_gap_of_a_job_the_backup_knew_as_queued_runs_once(live_clusters, tmp_path):
    """A job still QUEUED in the backup that started in the gap (an array's element materialized before the backup,
    a plain job, an element materialized in the gap) is adopted onto its own row after the restore, never admitted
    a second time; the array keeps every element once, within its parallelism, and still ends."""
    from jobs.arrays import top_up_arrays
    from jobs.models import JobArray
    from jobs.scheduling.passes import schedule_pending
    from tests.support.factories import make_job_row

    world = live_clusters
    array = _array_of_four(world)
    elements = {j.array_index: j.pk for j in Job.objects.filter(array=array)}
    assert sorted(elements) == [0, 1]
    first = _run_now(world, elements[0])
    spec = {"image": "registry.example/t:1", "command": ["python", "train.py"],
            "resources": {"accelerator": world.accelerator.name, "gpus_per_node": 2, "nodes": 1},
            "placement": {"clusters": ["gcp-usc1"]}, "max_runtime_seconds": 3600}
    plain = make_job_row(world.team, world.user, world.accelerator, name="plain", spec=spec, gpus_per_node=2,
                         nodes=1, max_runtime=3600)
    backup(tmp_path / "cp.dump")
    time.sleep(1.0)

    # The gap: element 1 and the plain job start; element 0 ends; element 2 is made and starts.
    second, started_plain = _run_now(world, elements[1]), _run_now(world, plain.pk)
    aws = world.emulators["aws-use1"]
    aws.finish_pod(aws.pods(first.pk)[0]["metadata"]["name"], 0)
    reconcile_all()
    assert Job.objects.get(pk=elements[0]).state == S.SUCCEEDED
    assert top_up_arrays() == 1
    third = _run_now(world, Job.objects.get(array=array, array_index=2).pk)
    gap = {"element 1": second, "plain": started_plain, "element 2": third}
    running = workloads(world)
    time.sleep(1.0)

    restore(tmp_path / "cp.dump")
    assert Job.objects.get(pk=elements[1]).state == S.QUEUED and Job.objects.get(pk=plain.pk).state == S.QUEUED
    out = io.StringIO()
    call_command("after_restore", stdout=out)
    report = json.loads(out.getvalue())
    assert report["listed_for_staff"] == []
    assert sorted(a["uid"] for a in report["adopted"]) == sorted(str(a.uid) for a in gap.values())
    for what, attempt in gap.items():
        row = JobAttempt.objects.select_related("job").get(uid=attempt.uid)
        assert (row.job_id, row.pk, row.job.state) == (attempt.job_id, attempt.pk, S.RUNNING), what
        assert row.job.current_attempt_id == row.pk and row.started_at == attempt.started_at, what
    assert Job.objects.get(pk=third.job_id).array_id == array.pk
    assert Job.objects.get(pk=third.job_id).array_index == 2

    # The passes after the restore: nothing admitted twice; element 3 waits while elements 1 and 2 run (the
    # parallelism counts the adopted ones), then is made once, past the index the restored array had made.
    for _ in range(2):
        schedule_pending()
        reconcile_all()
    assert workloads(world) == running  # element 0 done, elements 1 and 2 and the plain job still the only ones
    indexed = list(Job.objects.filter(array=array).values_list("array_index", flat=True))
    assert sorted(indexed) == [0, 1, 2]
    for attempt in (second, third):
        aws.finish_pod(aws.pods(attempt.pk)[0]["metadata"]["name"], 0)
    reconcile_all()
    schedule_pending()
    last = Job.objects.get(array=array, array_index=3)
    assert last.state == S.ADMITTED
    assert dispatch(last.current_attempt_id) == "dispatched"
    world.reconcile("aws-use1")
    aws.finish_pod(aws.pods(last.current_attempt_id)[0]["metadata"]["name"], 0)
    reconcile_all()
    assert sorted(Job.objects.filter(array=array).values_list("state", flat=True)) == [S.SUCCEEDED] * 4
    assert JobArray.objects.get(pk=array.pk).materialized == 4
    assert JobAttempt.objects.filter(job__array=array).count() == 4  # each element ran once
