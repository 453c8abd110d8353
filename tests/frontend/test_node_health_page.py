"""The clusters page lists the nodes that need attention with their health and evidence; staff cordon and clear them
there, others may not."""

from __future__ import annotations

from runners.models import Node
from tests.runners.api.test_nodes_endpoint import XID_79, make_nodes
from tests.support.personas import signed_in


def test_the_clusters_page_shows_an_unhealthy_node_with_its_evidence(owner, aws_cluster):
    made = make_nodes(aws_cluster)
    page = signed_in(owner).get("/clusters/").content.decode()
    assert "2 GPU nodes; 1 needs attention" in page
    assert f'id="node-{made["n1"].pk}"' in page and f'id="node-{made["n0"].pk}"' not in page
    assert "XID 79 (GPU has fallen off the bus)" in page and XID_79["message"] in page
    assert "Clear health" not in page  # no staff actions for a member


def test_staff_clear_and_cordon_from_the_clusters_page_and_a_member_is_refused(owner, staff, aws_cluster):
    made = make_nodes(aws_cluster)
    n0, n1 = made["n0"].pk, made["n1"].pk
    assert signed_in(owner).post(f"/nodes/{n1}/clear/").status_code == 403
    web = signed_in(staff)
    assert "Clear health" in web.get("/clusters/").content.decode()
    assert web.post(f"/nodes/{n1}/clear/").status_code == 302
    assert web.post(f"/nodes/{n0}/cordon/").status_code == 302
    assert Node.objects.get(pk=n1).health == "healthy"
    cordoned = Node.objects.get(pk=n0)
    assert cordoned.cordoned and cordoned.cordon_note == "by staff: from the clusters page"
    page = web.get("/clusters/").content.decode()
    assert f'id="node-{n0}"' in page and "Uncordon" in page and f'id="node-{n1}"' not in page
