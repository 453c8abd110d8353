"""``cpctl request``, ``requests``, ``approve``, ``decline`` and ``withdraw``: a team admin asks for a quota or budget
change, staff decide (ADR 0029); a direct write is refused, a bad value is exit 2 naming the field, a request whose
quota changed since is exit 6."""

from __future__ import annotations

from decimal import Decimal

from quotas.models import Budget, ChangeRequest, Quota

from .test_read import rows


def test_a_team_admin_requests_more_gpus_and_staff_approve_from_the_command_line(run_cli, owner, staff, fleet):
    quota = fleet["quota"]
    result = run_cli("request", "quota", "--team", "alpha", "--target", str(quota.pk), "--set", "nominal_gpus=24",
                     "--reason", "a second training run", persona=owner)
    assert result.code == 0, result.err
    change = ChangeRequest.objects.get()
    assert result.out.strip() == f"request {change.pk} (alpha): pending; quota {quota.pk}: nominal_gpus=24"
    listed = rows(run_cli("requests", "--state", "pending", persona=staff).out)
    assert listed[0][:4] == ["ID", "TEAM", "STATE", "ASKS FOR"]
    assert listed[1][:3] == [str(change.pk), "alpha", "pending"]
    assert run_cli("approve", str(change.pk), persona=owner).code == 4
    result = run_cli("approve", str(change.pk), "--note", "fits", persona=staff)
    assert result.code == 0, result.err
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 24
    assert run_cli("approve", str(change.pk), persona=staff).code == 6  # decided already


def test_a_bad_value_is_exit_2_naming_the_field_and_a_budget_request_is_declined(run_cli, owner, staff, fleet):
    budget = fleet["budget"]
    bad = run_cli("request", "budget", "--team", "alpha", "--target", str(budget.pk), "--set", "amount_usd=-5",
                  "--reason", "more", persona=owner)
    assert bad.code == 2 and "amount_usd" in bad.err, bad.err
    assert run_cli("request", "budget", "--team", "alpha", "--set", "amount_usd", "--reason", "x",
                   persona=owner).code == 2
    ok = run_cli("request", "budget", "--team", "alpha", "--target", str(budget.pk), "--set", "amount_usd=2500.00",
                 "--reason", "evaluation runs", persona=owner)
    assert ok.code == 0, ok.err
    change = ChangeRequest.objects.get()
    assert change.payload == {"amount_usd": "2500.00"}
    assert run_cli("decline", str(change.pk), persona=staff).code == 2  # --note is required
    result = run_cli("decline", str(change.pk), "--note", "not this quarter", persona=staff)
    assert result.code == 0 and "declined" in result.out
    assert Budget.objects.get(pk=budget.pk).amount_usd == Decimal("1000.00")


def test_a_request_whose_quota_changed_since_is_exit_6_and_the_requester_withdraws_it(run_cli, owner, staff, fleet):
    quota = fleet["quota"]
    run_cli("request", "quota", "--team", "alpha", "--target", str(quota.pk), "--set", "nominal_gpus=24",
            "--reason", "more", persona=owner)
    change = ChangeRequest.objects.get()
    Quota.objects.filter(pk=quota.pk).update(nominal_gpus=12)
    result = run_cli("approve", str(change.pk), persona=staff)
    assert result.code == 6 and "changed since the request" in result.err
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 12
    assert run_cli("withdraw", str(change.pk), persona=owner).code == 0
    assert ChangeRequest.objects.get().state == "withdrawn"
