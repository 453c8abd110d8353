"""``cpctl audit`` lists the audit trail with its filters, and staff's node commands send their reason to it
(``--note``, ``--reason``: percent-encoded UTF-8 in ``X-Audit-Reason``); a team's member sees its team's records
only (ADR 0031)."""

from __future__ import annotations

import json

from quotas.models import AuditRecord
from tests.runners.api.test_nodes_endpoint import make_nodes

from .test_read import rows


def test_staff_node_commands_are_listed_with_their_reasons_and_a_member_sees_only_the_team(
        run_cli, owner, staff, aws_cluster, quota_factory, alpha, h100):
    quota = quota_factory(alpha, h100, 8)
    assert staff.client.patch(f"/api/v1/quotas/{quota.pk}/", {"nominal_gpus": 12}, format="json",
                              headers={"X-Audit-Reason": "more GPUs for alpha"}).status_code == 200
    node = make_nodes(aws_cluster)["n0"]
    assert run_cli("cordon", str(node.pk), "--note", "reseating GPU 3", persona=staff).code == 0
    reason = "GPU reseated — 2× checked"
    assert run_cli("uncordon", str(node.pk), "--reason", reason, persona=staff).code == 0
    assert [(r.action, r.reason) for r in AuditRecord.objects.order_by("id")] == [
        ("updated", "more GPUs for alpha"), ("cordoned", "reseating GPU 3"), ("uncordoned", reason)]

    result = run_cli("audit", "--type", "node", persona=staff)
    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[0] == ["ID", "AT (UTC)", "ACTOR", "ACTION", "OBJECT", "TEAM", "CHANGED", "REASON"]
    assert [(r[2], r[3], r[5], r[6], r[7]) for r in table[1:]] == [
        ("staff", "uncordoned", "-", 'cordoned: true -> false; cordon_note: "by staff: reseating GPU 3" -> ""', reason),
        ("staff", "cordoned", "-", 'cordoned: false -> true; cordon_note: "" -> "by staff: reseating GPU 3"',
         "reseating GPU 3")]

    mine = json.loads(run_cli("audit", "--json", persona=owner).out)
    assert [(r["object_type"], r["team"], r["reason"]) for r in mine["results"]] == [
        ("quota", "alpha", "more GPUs for alpha")]
    assert run_cli("audit", "--action", "cordoned", persona=owner).err.strip() == "no audit records"
    assert rows(run_cli("audit", "--action", "cordoned", "--since", "2000-01-01", persona=staff).out)[1][3] == \
        "cordoned"
