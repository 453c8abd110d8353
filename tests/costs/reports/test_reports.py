"""Report generation on a fixed ledger (expected numbers computed here), the beat schedules, the task and its e-mail."""

from __future__ import annotations

import datetime as dt
import json
from datetime import UTC
from decimal import ROUND_HALF_EVEN, Decimal
from email.mime.base import MIMEBase

import pytest
import time_machine
from django.core import mail
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import ModelEntry

from controlplane.celery import app

app.loader.import_default_modules()  # what a worker and beat do at start: autodiscover every app's tasks.py
from costs.models import CostEntry, Report, UtilizationRollup  # noqa: E402 (after the tasks are loaded)
from costs.reports.build import build_report_data, generate_report, period_window  # noqa: E402 (after the tasks are loaded)
from costs.reports.schedules import TASK, ensure_report_schedules  # noqa: E402 (after the tasks are loaded)
from quotas.models import Budget, Quota  # noqa: E402 (after the tasks are loaded)
from tests.support.factories import make_attempt, make_cluster, make_cost_entry, make_job  # noqa: E402 (after the tasks are loaded)

pytestmark = pytest.mark.django_db
DAY = dt.datetime(2026, 3, 10, tzinfo=UTC)  # the reported day: [DAY, DAY + 1 day)
CENT = Decimal("0.01")


def cents(x: Decimal) -> str:
    return str(x.quantize(CENT, ROUND_HALF_EVEN))


def entry(attempt, start: dt.datetime, hours: Decimal, price: str) -> CostEntry:
    """A ledger line: ``attempt``'s GPUs over ``hours`` from ``start`` at ``price`` USD/GPU-hour."""
    return make_cost_entry(attempt, start, dt.timedelta(seconds=float(hours * 3600)),
                           attempt.gpus * hours * Decimal(price), usd_per_gpu_hour=price)


@pytest.fixture
def ledger(teams, owner, catalog):
    """Team alpha on 2026-03-10: job big (8 H100 x 2 h x 6.88 on aws), job small (4 A100 x 1.5 h x 3.00 on gcp);
    on 2026-03-09 (the previous day) big ran 1 h; on 2026-03-11 (after the period) 1 h more. Beta spent elsewhere."""
    alpha, beta = teams
    aws, aws_pool = make_cluster("aws-h100", "aws", "us-east-1", catalog["H100-80GB"])
    gcp, gcp_pool = make_cluster("gcp-a100", "gcp", "us-central1", catalog["A100-80GB"])
    big = make_job(alpha, owner.user, catalog["H100-80GB"], name="big", gpus_per_node=8)
    small = make_job(alpha, owner.user, catalog["A100-80GB"], name="small", gpus_per_node=4)
    other = make_job(beta, owner.user, catalog["H100-80GB"], name="beta-job", gpus_per_node=1)
    big_attempt = make_attempt(big, aws, aws_pool, state="SUCCEEDED")
    small_attempt = make_attempt(small, gcp, gcp_pool, state="SUCCEEDED")
    other_attempt = make_attempt(other, aws, aws_pool, state="SUCCEEDED")
    entry(big_attempt, DAY + dt.timedelta(hours=10), Decimal(2), "6.88")
    entry(small_attempt, DAY + dt.timedelta(hours=13), Decimal("1.5"), "3.00")
    entry(big_attempt, DAY - dt.timedelta(hours=14), Decimal(1), "6.88")
    entry(big_attempt, DAY + dt.timedelta(days=1, hours=2), Decimal(1), "6.88")
    entry(other_attempt, DAY + dt.timedelta(hours=1), Decimal(5), "6.88")
    # DCGM rollup of big on the day: 480 samples averaging 40 %, a quarter of its 16 GPU-hours idle.
    UtilizationRollup.objects.create(
        attempt=big_attempt, job=big, team=alpha, cluster=aws, accelerator=catalog["H100-80GB"], day=DAY.date(),
        gpu_seconds=16 * 3600, samples=480, expected_samples=480, util_sum=480 * 40.0, avg_gpu_util_percent=40.0,
        observed_gpu_seconds=16 * 3600, idle_gpu_seconds=4 * 3600)
    Quota.objects.create(team=alpha, accelerator=catalog["H100-80GB"], nominal_gpus=16, borrowing_limit_gpus=8)
    Budget.objects.create(team=alpha, amount_usd=Decimal("5000.00"), action="block")
    owner.user.email = "owner@example.com"
    owner.user.save()
    return {"alpha": alpha, "big": big, "small": small}


def test_the_report_numbers_match_the_ledger(ledger):
    data = build_report_data(ledger["alpha"], DAY, DAY + dt.timedelta(days=1))
    big_usd, small_usd = 8 * 2 * Decimal("6.88"), 4 * Decimal("1.5") * Decimal("3.00")  # 110.08, 18.00
    assert data["totals"] == {"gpu_hours": 16 + 6.0, "cost_usd": cents(big_usd + small_usd),
                              "unpriced_gpu_hours": 0.0, "unpriced_vcpu_hours": 0.0}
    assert data["by_accelerator"] == [
        {"accelerator": "A100-80GB", "gpu_hours": 6.0, "cost_usd": cents(small_usd), "unpriced_gpu_hours": 0.0,
         "unpriced_vcpu_hours": 0.0},
        {"accelerator": "H100-80GB", "gpu_hours": 16.0, "cost_usd": cents(big_usd), "unpriced_gpu_hours": 0.0,
         "unpriced_vcpu_hours": 0.0}]
    assert [(r["cluster"], r["cost_usd"]) for r in data["by_cluster"]] == [("aws-h100", "110.08"), ("gcp-a100", "18.00")]
    assert [(j["job_name"], j["cost_usd"], j["gpu_hours"]) for j in data["top_jobs"]] == [
        ("big", "110.08", 16.0), ("small", "18.00", 6.0)]
    # Utilization: sample weighted 40 %; idle: 4 of big's 16 GPU-hours, so a quarter of its day's cost.
    util = data["utilization"]
    assert util["avg_gpu_util_percent"] == 40.0 and util["coverage_percent"] == 100.0
    assert util["idle_gpu_hours"] == 4.0 and util["idle_cost_usd"] == cents(big_usd / 4)
    assert util["missing"] is False
    # big's 16 GPU-hours have metrics, small's 6 (on a cluster without Prometheus) do not: the allocation is the
    # ledger's 22 GPU-hours all the same, small's unobserved.
    assert (util["allocated_gpu_hours"], util["observed_gpu_hours"], util["unobserved_gpu_hours"]) == (22.0, 16.0, 6.0)
    assert "Utilization covers" not in util["note"]
    # Quota: 16 H100 GPU-hours over 24 h = 0.667 GPUs on average, 4.17 % of the 16 nominal.
    h100 = next(q for q in data["quota_use"] if q["accelerator"] == "H100-80GB")
    assert h100 == {"accelerator": "H100-80GB", "nominal_gpus": 16, "borrowing_limit_gpus": 8, "gpu_hours": 16.0,
                    "avg_gpus_in_use": round(16 / 24, 3), "percent_of_nominal": round(round(16 / 24, 3) / 16 * 100, 2)}
    # Budget of the period holding the report's last instant (March), as it stood at the report's end: the
    # March entries up to then (03-09 and 03-10, not 03-11's), no job running then, and the forecast's rate the
    # median daily spend of 03-03..03-09 (six days without spend, one at $55.04): 0.
    spent = big_usd + small_usd + 8 * Decimal("6.88")
    (budget,) = data["budgets"]
    assert budget["spent_usd"] == cents(spent) and budget["committed_usd"] == "0.00"
    assert budget["remaining_usd"] == cents(Decimal("5000") - spent)
    assert budget["forecast_usd"] == cents(spent) and budget["forecast_rate_usd_per_day"] == "0.00"
    assert budget["as_of"] == (DAY + dt.timedelta(days=1)).isoformat()
    # Against 2026-03-09: 8 GPU-hours and 55.04 USD.
    previous = data["previous"]
    assert previous["gpu_hours"] == 8.0 and previous["cost_usd"] == "55.04"
    assert previous["cost_change_percent"] == round(float((big_usd + small_usd - Decimal("55.04")) / Decimal("55.04") * 100), 2)
    assert previous["gpu_hours_change_percent"] == 175.0


def test_a_period_without_metrics_says_so(ledger):
    UtilizationRollup.objects.all().delete()
    report, created = generate_report(ledger["alpha"], DAY, DAY + dt.timedelta(days=1), Report.Kind.DAILY)
    assert created
    util = report.data["utilization"]
    assert util["avg_gpu_util_percent"] is None and util["missing"] is True and util["idle_gpu_hours"] is None
    assert "GPU metrics are missing" in report.html and "no data" in report.html
    assert "utilization,alpha,avg_gpu_util_percent,no data" in report.csv.splitlines()


def test_the_csv_holds_every_section(ledger):
    report, _ = generate_report(ledger["alpha"], DAY, DAY + dt.timedelta(days=1))
    lines = report.csv.splitlines()
    assert lines[0] == "section,item,metric,value"
    for line in ["total,alpha,cost_usd,128.08", "accelerator,H100-80GB,gpu_hours,16.0", "cluster,gcp-a100,cost_usd,18.00",
                 f"top_job,1:{ledger['big'].pk}:big,cost_usd,110.08", "quota,H100-80GB,nominal_gpus,16",
                 "budget,alpha:monthly,spent_usd,183.12", "previous_period,alpha,cost_usd,55.04",
                 "utilization,alpha,avg_gpu_util_percent,40.0"]:
        assert line in lines, line
    again, created = generate_report(ledger["alpha"], DAY, DAY + dt.timedelta(days=1))
    assert not created and again.pk == report.pk  # idempotent per scope and period


def test_the_platform_report_covers_every_team(ledger):
    data = build_report_data(None, DAY, DAY + dt.timedelta(days=1))
    assert data["scope"] == "platform"
    assert data["totals"]["cost_usd"] == cents(8 * 2 * Decimal("6.88") + 6 * Decimal("3.00") + 5 * Decimal("6.88"))
    assert [j["team"] for j in data["top_jobs"]] == ["alpha", "beta", "alpha"]


def test_period_windows_are_the_last_complete_day_and_iso_week():
    at = dt.datetime(2026, 3, 12, 6, 0, tzinfo=UTC)  # a Thursday
    assert period_window("daily", at) == (dt.datetime(2026, 3, 11, tzinfo=UTC), dt.datetime(2026, 3, 12, tzinfo=UTC))
    assert period_window("weekly", at) == (dt.datetime(2026, 3, 2, tzinfo=UTC), dt.datetime(2026, 3, 9, tzinfo=UTC))


def test_the_schedules_exist_and_fire_the_report_task_through_beat(ledger, settings):
    # At the daily schedule's time on a day after the ledger's: the report it fires for is due, whatever the clock.
    with time_machine.travel(dt.datetime(2026, 4, 2, 6, 0, 5, tzinfo=UTC), tick=False):
        fire_the_schedules(ledger)


def fire_the_schedules(ledger):
    ensure_report_schedules()
    ensure_report_schedules()  # idempotent
    tasks = {t.name: t for t in PeriodicTask.objects.filter(task=TASK)}
    assert set(tasks) == {f"report {p} {s}" for p in ("daily", "weekly")
                          for s in ("platform", "team alpha", "team beta")}
    daily, weekly = tasks["report daily team alpha"], tasks["report weekly platform"]
    assert (daily.crontab.minute, daily.crontab.hour, daily.crontab.day_of_week) == ("0", "6", "*")
    assert (weekly.crontab.minute, weekly.crontab.hour, weekly.crontab.day_of_week) == ("30", "6", "1")
    assert json.loads(daily.kwargs) == {"period": "daily", "scope": "alpha"}

    # Beat's own entry for the row: due after a day without running, and it names our registered task.
    entry_ = ModelEntry(daily, app=app)
    entry_.last_run_at = timezone.now() - dt.timedelta(days=2)
    assert entry_.is_due().is_due
    assert entry_.task in app.tasks
    # Put a day of cost into yesterday, so the daily report of the period beat fires for has numbers.
    start, _ = period_window("daily")
    attempt = ledger["big"].current_attempt
    entry(attempt, start + dt.timedelta(hours=3), Decimal(1), "6.88")
    app.tasks[entry_.task].apply(args=entry_.args, kwargs=entry_.kwargs).get()

    report = Report.objects.get(team=ledger["alpha"], kind="daily")
    assert report.period_start == start and report.data["totals"]["cost_usd"] == cents(8 * Decimal("6.88"))
    (message,) = mail.outbox
    assert message.to == ["owner@example.com"] and "daily report alpha" in message.subject
    html, mimetype = message.alternatives[0]
    assert mimetype == "text/html" and 'src="cid:cost_by_accelerator"' in html
    attachments = message.message().get_payload()
    images = [p for p in attachments if p.get_content_type() == "image/png"]
    assert images and images[0]["Content-ID"] == "<cost_by_accelerator>"
    assert images[0].get_payload(decode=True).startswith(b"\x89PNG")
    (csv_name, csv_body, csv_type), = [a for a in message.attachments if not isinstance(a, MIMEBase)]
    assert csv_name.endswith(".csv") and csv_type == "text/csv" and csv_body == report.csv
    # A redelivered message refreshes the report and sends nothing more.
    app.tasks[entry_.task].apply(args=entry_.args, kwargs=entry_.kwargs).get()
    assert Report.objects.filter(team=ledger["alpha"], kind="daily").count() == 1 and len(mail.outbox) == 1
