"""``cpctl nodes`` shows each GPU node's health and evidence; ``cordon``, ``uncordon`` and ``clear-health`` are staff's."""

from __future__ import annotations

from runners.models import Node
from tests.runners.api.test_nodes_endpoint import XID_79, make_nodes

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
