"""Failure domain = one cluster (docs/adr/0016).

Class of failure: one cluster's fault stops every cluster. Invariant: a fault of one cluster (its stored credential
cannot be decrypted, e.g. the encryption key changed, or the cluster refuses it with 401 / 403) never stops the
reconcile, node pool sync, node health check, accrual, scheduling, workload metrics, end record expiry or API
answers of another cluster; the broken cluster is shown as not healthy with a reason a user can act on, and is
healthy again once its credential is re-entered.

Clusters are emulated over HTTP (``tests/support/kubernetes.py``); an unreadable credential is a ciphertext made with
another Fernet key, written into the column by SQL (as a row written under another key would be).
"""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.utils import timezone

from jobs import reconcile
from jobs.lifecycle import dispatch
from jobs.models import Job, JobAttempt, JobState
from runners.credentials import PREFIX
from runners.models import Cluster, Node, NodePool
from tests.support.clusters import H100_LABEL, World, load, state
from tests.support.factories import make_job_row
from tests.support.kubernetes import Fault
from tests.support.personas import signed_in

BROKEN, OTHER = "aws-use1", "gcp-usc1"
#: What a user reads on the broken cluster for each fault: what to do about it.
ACTIONABLE = "re-enter it"


def unreadable(cluster: Cluster, field: str = "api_token") -> None:
    """Store in ``cluster``'s ``field`` a credential encrypted with a key that is not the configured one (raw SQL)."""
    foreign = PREFIX + Fernet(Fernet.generate_key()).encrypt(b"token-under-another-key").decode()
    column = Cluster._meta.get_field(field).column
    with connection.cursor() as cursor:
        cursor.execute(f'UPDATE {Cluster._meta.db_table} SET "{column}" = %s WHERE id = %s', [foreign, cluster.pk])


def page_json(response) -> list[dict]:
    body = response.json()
    return body["results"] if isinstance(body, dict) and "results" in body else body


def running_on_each(world: World) -> dict[str, JobAttempt]:
    """One job admitted, dispatched and RUNNING on each cluster (one reconcile pass), by cluster name."""
    attempts = {name: world.admit(cluster=name, gpus=8) for name in (BROKEN, OTHER)}
    for attempt in attempts.values():
        assert dispatch(attempt.pk) == "dispatched"
    reconcile.reconcile_all()
    assert {name: state(a) for name, a in attempts.items()} == {BROKEN: JobState.RUNNING, OTHER: JobState.RUNNING}
    return attempts


def test_an_unreadable_credential_on_one_cluster_stops_no_other_cluster(live_clusters, owner, staff):
    """Regression: two clusters, a job on each; the first cluster's api_token becomes unreadable (another key).

    Reconcile still notices that the job on the other cluster ended; the jobs and clusters API answer 200 with
    both jobs; the broken cluster is shown degraded, in the API and on the clusters page, with a reason that says
    to re-enter the credential; re-entering it makes it healthy again."""
    world = live_clusters
    attempts = running_on_each(world)
    unreadable(world.clusters[BROKEN])
    other = world.emulators[OTHER]
    for pod in other.pods(attempts[OTHER].pk):
        other.finish_pod(pod["metadata"]["name"], 0)

    results = {r["cluster"]: r for r in reconcile.reconcile_all()}

    assert state(attempts[OTHER]) == JobState.SUCCEEDED
    assert state(attempts[BROKEN]) == JobState.RUNNING  # its work is left alone (CLUSTER_LOST_GRACE_SECONDS)
    assert results[BROKEN]["unreachable"] and "cannot be decrypted" in results[BROKEN]["failure"]
    broken = Cluster.objects.get(name=BROKEN)
    assert broken.health == Cluster.Health.DEGRADED
    assert "credential cannot be decrypted with the configured key; re-enter it" in broken.health_reason

    clusters = owner.client.get("/api/v1/clusters/")
    assert clusters.status_code == 200
    shown = {c["name"]: c for c in page_json(clusters)}
    assert shown[BROKEN]["health"] == "degraded" and shown[BROKEN]["health_reason"] == broken.health_reason
    assert shown[BROKEN]["auth_configured"] is True
    assert owner.client.get(f"/api/v1/clusters/{broken.pk}/").status_code == 200
    jobs = owner.client.get("/api/v1/jobs/")
    assert jobs.status_code == 200
    assert {a.job_id for a in attempts.values()} <= {j["id"] for j in page_json(jobs)}
    for attempt in attempts.values():
        detail = owner.client.get(f"/api/v1/jobs/{attempt.job_id}/")
        assert detail.status_code == 200 and detail.json()["id"] == attempt.job_id
    page = signed_in(owner).get("/clusters/")
    assert page.status_code == 200
    assert "credential cannot be decrypted with the configured key; re-enter it" in page.content.decode()

    answer = staff.client.patch(f"/api/v1/clusters/{broken.pk}/", {"api_token": f"token-of-{BROKEN}"}, format="json")
    assert answer.status_code == 200, answer.content
    from quotas.models import AuditRecord

    (changed,) = AuditRecord.objects.filter(object_type="cluster", object_id=broken.pk, action="updated")
    assert (changed.before["api_token"], changed.after["api_token"]) == ("unreadable", "credential changed")
    reconcile.reconcile_all()
    healed = Cluster.objects.get(name=BROKEN)
    assert (healed.health, healed.health_reason) == (Cluster.Health.HEALTHY, "")
    assert state(attempts[BROKEN]) == JobState.RUNNING


def test_loading_a_row_never_raises_and_saving_it_keeps_the_unreadable_ciphertext(catalog, h100):
    """The marker is truthy, never shows the ciphertext, raises CredentialUnreadable only where the clear text is
    asked for, and a save of the row writes the ciphertext back as it was (the right key reads it again)."""
    from runners.credentials import CredentialUnreadable, UnreadableSecret
    from tests.support.factories import make_cluster

    cluster, _ = make_cluster("aws-use1", "aws", "us-east-1", h100)
    Cluster.objects.filter(pk=cluster.pk).update(api_token="")
    unreadable(cluster)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT api_token FROM {Cluster._meta.db_table} WHERE id = %s", [cluster.pk])
        (stored,) = cursor.fetchone()
    row = Cluster.objects.get(pk=cluster.pk)
    assert isinstance(row.api_token, UnreadableSecret) and bool(row.api_token)
    assert stored not in repr(row.api_token)
    with pytest.raises(CredentialUnreadable, match=ACTIONABLE):
        str(row.api_token)
    row.region = "us-east-2"
    row.save()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT api_token FROM {Cluster._meta.db_table} WHERE id = %s", [cluster.pk])
        assert cursor.fetchone() == (stored,)


# --- the class: every per-cluster entry point, with one cluster broken in each way ---------------------------------

def break_cluster(world: World, how: str) -> None:
    """Break cluster BROKEN: a stored credential unreadable (``api_token``, ``kubeconfig``), or every call answered
    401 Unauthorized / 403 Forbidden (the cluster refuses the credential)."""
    if how.startswith("unreadable-"):
        unreadable(world.clusters[BROKEN], how.removeprefix("unreadable-"))
    else:
        world.emulators[BROKEN].inject(Fault(int(how), count=None))


def entry_reconcile(world: World, attempts: dict) -> None:
    """A job that ended on the other cluster is noticed; the broken one is not healthy, with the reason."""
    other = world.emulators[OTHER]
    for pod in other.pods(attempts[OTHER].pk):
        other.finish_pod(pod["metadata"]["name"], 0)
    reconcile.reconcile_all()
    assert state(attempts[OTHER]) == JobState.SUCCEEDED
    broken = Cluster.objects.get(name=BROKEN)
    assert broken.health != Cluster.Health.HEALTHY and ACTIONABLE in broken.health_reason
    assert Cluster.objects.get(name=OTHER).health == Cluster.Health.HEALTHY


def entry_node_pool_sync(world: World, attempts: dict) -> None:
    """A node added to the other cluster is synced into its pool."""
    from runners.tasks import sync_node_pools

    world.emulators[OTHER].add_node(f"{OTHER}-gpu-9", 8, {"nvidia.com/gpu.product": H100_LABEL})
    results = {r["cluster"]: r for r in sync_node_pools()}
    assert "error" not in results[OTHER] and "error" in results[BROKEN]
    assert sum(p.nodes for p in NodePool.objects.filter(cluster__name=OTHER)) == 3
    assert Node.objects.filter(cluster__name=OTHER, name=f"{OTHER}-gpu-9").exists()


def entry_node_health(world: World, attempts: dict) -> None:
    """The other cluster's nodes are judged."""
    from runners.tasks import check_node_health

    Node.objects.update(health_checked_at=None)
    results = {r["cluster"]: r for r in check_node_health()}
    assert "error" not in results[OTHER]
    assert not Node.objects.filter(cluster__name=OTHER, health_checked_at__isnull=True).exists()


def entry_accrual(world: World, attempts: dict) -> None:
    """The other cluster's running attempt is accrued in the ledger."""
    from costs.ledger import accrue_running
    from costs.models import CostEntry

    accrue_running(timezone.now() + dt.timedelta(seconds=60))
    assert CostEntry.objects.filter(attempt_id=attempts[OTHER].pk).exists()


def entry_scheduling(world: World, attempts: dict) -> None:
    """A scheduling pass admits a new job onto the other cluster."""
    from jobs.scheduling.passes import schedule_pending

    job = make_job_row(world.team, world.user, world.accelerator, name="next", gpus_per_node=8,
                       placement={"clusters": [OTHER]})
    schedule_pending()
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.ADMITTED, job.queue_info
    assert load(job.current_attempt_id).cluster.name == OTHER


def entry_workload_metrics(world: World, attempts: dict) -> None:
    """The other cluster's running training attempt is read."""
    from jobs.tasks import collect_workload_metrics

    assert collect_workload_metrics()["collected"] >= 1


def entry_end_record_expiry(world: World, attempts: dict) -> None:
    """The other cluster's end records are swept."""
    reconcile.LAST_SWEEP.clear()
    reconcile.expire_end_records()
    assert world.clusters[OTHER].pk in reconcile.LAST_SWEEP


def entry_api(world: World, attempts: dict) -> None:
    """The clusters and jobs API and the clusters page answer 200 with every cluster and job."""
    from tests.support.personas import make_persona

    member = make_persona("member-of-alpha", world.team, "member")
    clusters = member.client.get("/api/v1/clusters/")
    assert clusters.status_code == 200 and {c["name"] for c in page_json(clusters)} == {BROKEN, OTHER}
    jobs = member.client.get("/api/v1/jobs/")
    assert jobs.status_code == 200
    assert {a.job_id for a in attempts.values()} <= {j["id"] for j in page_json(jobs)}
    for attempt in attempts.values():
        assert member.client.get(f"/api/v1/jobs/{attempt.job_id}/").status_code == 200
    assert signed_in(member).get("/clusters/").status_code == 200


ENTRY_POINTS = [entry_reconcile, entry_node_pool_sync, entry_node_health, entry_accrual, entry_scheduling,
                entry_workload_metrics, entry_end_record_expiry, entry_api]
FAULTS = ["unreadable-api_token", "unreadable-kubeconfig", "401", "403"]


@pytest.mark.parametrize("how", FAULTS)
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__.removeprefix("entry_"))
def test_one_broken_cluster_never_stops_another_clusters_work(live_clusters, settings, entry, how):
    """For every per-cluster periodic task and API entry point, and every way a cluster's credential breaks
    (unreadable under the configured key, or refused with 401 / 403): the other cluster's work still happens."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    world = live_clusters
    from runners.tasks import sync_node_pools

    sync_node_pools()  # Node rows for the node health check
    attempts = running_on_each(world)
    break_cluster(world, how)
    entry(world, attempts)
