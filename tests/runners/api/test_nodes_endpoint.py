"""``/api/v1/nodes/``: every user reads each GPU node's health with its evidence and what is allocated and free on it;
staff cordon, drain, uncordon and clear."""

from __future__ import annotations

from django.utils import timezone

from jobs.models import FREE_RETRY_END_REASONS, JobAttempt
from quotas.models import AuditRecord
from runners import health
from runners.models import Node
from tests.support.factories import make_attempt, make_job

XID_79 = health.finding("dcgm", "xid", "unhealthy", "GPU 3 (GPU-n1-3): XID 79 (GPU has fallen off the bus)",
                        key="dcgm:xid:GPU-n1-3", value=79, gpu="3", uuid="GPU-n1-3")


def make_nodes(aws_cluster) -> dict[str, Node]:
    """Nodes n0 (healthy) and n1 (unhealthy: XID 79 on GPU 3) of the AWS cluster's pool."""
    now = timezone.now()
    made = {name: Node.objects.create(cluster=aws_cluster["cluster"], node_pool=aws_cluster["pool"], name=name, gpus=8,
                                      cpu_milli=64_000, memory_mib=512 * 1024, seen_at=now) for name in ("n0", "n1")}
    health.store_health(made["n1"], "unhealthy", [XID_79], now)
    return made


def test_every_user_reads_each_nodes_health_with_its_evidence(owner, outsider, aws_cluster):
    make_nodes(aws_cluster)
    for persona in (owner, outsider):
        rows = {n["name"]: n for n in persona.client.get("/api/v1/nodes/").json()["results"]}
        assert (rows["n0"]["health"], rows["n0"]["takes_work"]) == ("healthy", True)
        assert (rows["n1"]["health"], rows["n1"]["takes_work"]) == ("unhealthy", False)
        assert [e["message"] for e in rows["n1"]["health_evidence"]] == [XID_79["message"]]
    only = owner.client.get("/api/v1/nodes/", {"health": "unhealthy", "cluster": "aws-use1"}).json()["results"]
    assert [n["name"] for n in only] == ["n1"]


def test_the_cluster_shows_its_nodes_by_health(owner, aws_cluster):
    make_nodes(aws_cluster)
    body = owner.client.get(f"/api/v1/clusters/{aws_cluster['cluster'].pk}/").json()
    assert body["node_health"] == {"nodes": 2, "healthy": 1, "suspect": 0, "unhealthy": 1, "unhealthy_nodes": ["n1"],
                                   "suspect_nodes": [], "cordoned_nodes": []}


def test_staff_cordon_uncordon_and_clear_a_node_and_no_one_else_may(owner, staff, aws_cluster):
    made = make_nodes(aws_cluster)
    n0, n1 = made["n0"].pk, made["n1"].pk
    assert owner.client.post(f"/api/v1/nodes/{n0}/cordon/", {"note": "x"}, content_type="application/json"
                             ).status_code == 403
    assert owner.client.post(f"/api/v1/nodes/{n1}/clear/").status_code == 403
    body = staff.client.post(f"/api/v1/nodes/{n0}/cordon/", {"note": "reseating GPU 3"},
                             content_type="application/json").json()
    assert (body["cordoned"], body["takes_work"], body["cordon_note"]) == (True, False, "by staff: reseating GPU 3")
    body = staff.client.post(f"/api/v1/nodes/{n0}/uncordon/").json()
    assert (body["cordoned"], body["takes_work"]) == (False, True)
    body = staff.client.post(f"/api/v1/nodes/{n1}/clear/").json()
    assert (body["health"], body["health_evidence"], body["takes_work"]) == ("healthy", [], True)
    assert Node.objects.get(pk=n1).health_baseline == {"dcgm:xid:GPU-n1-3": 79}
    assert staff.client.post("/api/v1/nodes/999999/clear/").status_code == 404


def test_each_node_says_what_is_allocated_and_free_on_it(owner, aws_cluster, teams, h100):
    made = make_nodes(aws_cluster)
    Node.objects.filter(pk=made["n0"].pk).update(foreign_gpus=2, foreign_cpu_milli=4_000, foreign_memory_mib=1024)
    job = make_job(teams[0], owner.user, h100, name="on-n0", gpus_per_node=3)
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], gpus=3)
    JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": ["n0"], "gpus_per_node": 3,
                                                               "cpu_milli": 12_000, "memory_mib": 32 * 1024})
    rows = {n["name"]: n for n in owner.client.get("/api/v1/nodes/").json()["results"]}
    figures = ("allocated_gpus", "free_gpus", "free_cpu_milli", "free_memory_mib")
    # n0: 8 GPUs - 3 placed - 2 of other pods; 64 000 - 12 000 - 4 000 millicores; 512 GiB - 32 GiB - 1 GiB in MiB
    assert tuple(rows["n0"][k] for k in figures) == (5, 3, 48_000, 512 * 1024 - 32 * 1024 - 1024)
    # n1 is unhealthy: it takes no work, so nothing is free there though nothing is held
    assert tuple(rows["n1"][k] for k in figures) == (0, 0, 0, 0)
    one = owner.client.get(f"/api/v1/nodes/{made['n0'].pk}/").json()
    assert tuple(one[k] for k in figures) == (5, 3, 48_000, 512 * 1024 - 32 * 1024 - 1024)


def test_staff_drain_a_node_its_attempts_end_preempted_and_a_member_changes_nothing(owner, staff, aws_cluster, teams,
                                                                                       h100):
    made = make_nodes(aws_cluster)
    n0 = made["n0"].pk
    on_n0 = make_attempt(make_job(teams[0], owner.user, h100, name="on-n0", gpus_per_node=4), aws_cluster["cluster"],
                         aws_cluster["pool"], gpus=4)
    on_n1 = make_attempt(make_job(teams[0], owner.user, h100, name="on-n1", gpus_per_node=2), aws_cluster["cluster"],
                         aws_cluster["pool"], gpus=2)
    for attempt, node in ((on_n0, "n0"), (on_n1, "n1")):
        JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": [node], "gpus_per_node": attempt.gpus})

    refused = owner.client.post(f"/api/v1/nodes/{n0}/drain/", {"note": "x"}, content_type="application/json")
    assert refused.status_code == 403
    assert not Node.objects.get(pk=n0).cordoned
    assert JobAttempt.objects.get(pk=on_n0.pk).ended_at is None
    assert not AuditRecord.objects.filter(object_type="node").exists()

    answer = staff.client.post(f"/api/v1/nodes/{n0}/drain/", {}, content_type="application/json",
                               headers={"X-Audit-Reason": "replacing GPU 3"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["cordoned"], body["takes_work"], body["cordon_note"], body["preempted_attempts"]) == (
        True, False, "by staff: replacing GPU 3", 1)
    ended = JobAttempt.objects.get(pk=on_n0.pk)
    assert (ended.ended_at is not None, ended.end_reason, ended.job.state) == (True, "Preempted", "RECOVERING")
    assert ended.end_reason in FREE_RETRY_END_REASONS  # no retry used
    assert JobAttempt.objects.get(pk=on_n1.pk).ended_at is None  # another node's work stays
    got = [(r.action, r.reason, r.before["cordoned"], r.after["cordoned"], r.actor_name)
           for r in AuditRecord.objects.filter(object_type="node", object_id=n0)]
    assert got == [("drained", "replacing GPU 3", False, True, "staff")]


def test_a_drain_note_must_be_text(staff, aws_cluster):
    n0 = make_nodes(aws_cluster)["n0"].pk
    answer = staff.client.post(f"/api/v1/nodes/{n0}/drain/", {"note": 7}, content_type="application/json")
    assert answer.status_code == 400 and "note" in answer.json()
    assert not Node.objects.get(pk=n0).cordoned
