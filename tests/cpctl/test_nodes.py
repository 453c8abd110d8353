"""``cpctl nodes`` shows each GPU node's health and evidence; ``cordon``, ``drain``, ``uncordon`` and ``clear-health`` are
staff's."""

from __future__ import annotations

from jobs.models import JobAttempt
from runners.models import Node
from tests.runners.api.test_nodes_endpoint import XID_79, make_nodes
from tests.support.factories import make_attempt, make_job

from .test_read import rows


def test_nodes_is_a_table_with_health_and_evidence(run_cli, owner, aws_cluster):
    made = make_nodes(aws_cluster)
    result = run_cli("nodes", "--health", "unhealthy", persona=owner)
    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[0] == ["ID", "CLUSTER", "NODE", "POOL", "GPUS", "HEALTH", "TAKES WORK", "EVIDENCE"]
    assert table[1:] == [[str(made["n1"].pk), "aws-use1", "n1", aws_cluster["pool"].name, "8", "unhealthy", "no",
                          XID_79["message"]]]


def test_staff_cordon_and_clear_a_node_and_a_member_gets_403(run_cli, owner, staff, aws_cluster):
    made = make_nodes(aws_cluster)
    assert run_cli("cordon", str(made["n0"].pk), persona=owner).code == 4
    result = run_cli("cordon", str(made["n0"].pk), "--note", "reseating GPU 3", persona=staff)
    assert result.code == 0, result.err
    assert result.out.strip() == "node aws-use1/n0: healthy, cordoned, takes no work"
    assert Node.objects.get(pk=made["n0"].pk).cordon_note == "by staff: reseating GPU 3"
    result = run_cli("clear-health", str(made["n1"].pk), persona=staff)
    assert result.out.strip() == "node aws-use1/n1: healthy, not cordoned, takes work"
    assert run_cli("uncordon", str(made["n0"].pk), persona=staff).out.strip() == (
        "node aws-use1/n0: healthy, not cordoned, takes work")


def test_staff_drain_a_node_from_the_command_line_and_a_member_gets_403(run_cli, owner, staff, aws_cluster, teams, h100):
    made = make_nodes(aws_cluster)
    attempt = make_attempt(make_job(teams[0], owner.user, h100, name="on-n0", gpus_per_node=4), aws_cluster["cluster"],
                           aws_cluster["pool"], gpus=4)
    JobAttempt.objects.filter(pk=attempt.pk).update(placement={"nodes": ["n0"], "gpus_per_node": 4})
    refused = run_cli("drain", str(made["n0"].pk), persona=owner)
    assert refused.code == 4 and not Node.objects.get(pk=made["n0"].pk).cordoned
    result = run_cli("drain", str(made["n0"].pk), "--note", "replacing GPU 3", persona=staff)
    assert result.code == 0, result.err
    assert result.out.strip() == ("node aws-use1/n0: healthy, cordoned, takes no work; 1 attempt(s) preempted, "
                                  "no retry used")
    assert JobAttempt.objects.get(pk=attempt.pk).end_reason == "Preempted"
    again = run_cli("drain", str(made["n0"].pk), "--json", persona=staff)
    assert again.code == 0 and '"preempted_attempts": 0' in again.out
