"""The ledger's hot reads use its indexes on a realistic layout: teams' rows interleaved hour by hour, as accrual
writes them, and a year of day rollups, so no read scans the history.

The queries are the real ones (captured while the functions run), explained
by PostgreSQL after ANALYZE.
"""

from __future__ import annotations

import datetime as dt
import json
from datetime import UTC

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from costs.aggregation import aggregate_window
from costs.ledger import accrue_running
from costs.models import CostEntry, DailyCostRollup, JobDailyCost
from costs.spend import ledger_usd_prorated, period_spend, unpriced_usage
from jobs.models import JobAttempt, JobState
from quotas.models import Team
from tests.support.factories import make_attempt, make_job_row

NOW = dt.datetime(2026, 6, 20, 12, 30, tzinfo=UTC)
HOURS = 40 * 24  # of entries
DAYS = 400  # of rollups
TEAMS, ATTEMPTS_PER_TEAM = 40, 3

pytestmark = pytest.mark.django_db


@pytest.fixture
def layout(user, h100, cluster_factory):
    """40 teams x 3 running attempts; 40 days of hourly entries interleaved across teams; 400 days of rollups
    (per team and per job)."""
    _, pool = cluster_factory("eks", "aws", "us-east-1", h100, price="6.88", nodes=100)
    teams = [Team.objects.create(slug=f"t{i:02d}", name=f"T{i}") for i in range(TEAMS)]
    start = NOW.replace(minute=0) - dt.timedelta(hours=HOURS)
    for team in teams:
        for n in range(ATTEMPTS_PER_TEAM):
            job = make_job_row(team, user, h100, name=f"j{n}", spec={}, gpus_per_node=2, max_runtime=86400 * 90,
                               state=JobState.RUNNING)
            make_attempt(job, pool.cluster, pool, gpus=2, started_at=start, usd_per_gpu_hour="6.88")
    entry_t, rollup_t, attempt_t = CostEntry._meta.db_table, DailyCostRollup._meta.db_table, JobAttempt._meta.db_table
    job_day_t, team_t = JobDailyCost._meta.db_table, Team._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{entry_t}" (attempt_id, job_id, team_id, cluster_id, accelerator_id, interval_start, '
            f"interval_end, gpu_milli, usd_per_gpu_hour, amount_usd, created_at) "
            f"SELECT a.id, a.job_id, j.team_id, a.cluster_id, %s, %s + h * interval '1 hour', "
            f"%s + (h + 1) * interval '1 hour', a.gpus * 1000, p.price, a.gpus * p.price, now() "
            f'FROM generate_series(0, %s) AS h CROSS JOIN "{attempt_t}" AS a JOIN jobs_job AS j ON j.id = a.job_id '
            f"CROSS JOIN LATERAL (SELECT CASE WHEN a.id %% 17 = 0 THEN NULL ELSE 6.88 END AS price) AS p "
            f"ORDER BY h, a.id", [h100.pk, start, start, HOURS - 1])
        cursor.execute(f'UPDATE "{attempt_t}" SET accrued_until = %s', [start + dt.timedelta(hours=HOURS)])
        cursor.execute(
            f'INSERT INTO "{rollup_t}" (day, team_id, cluster_id, accelerator_id, gpu_seconds, cost_usd, '
            f"unpriced_gpu_seconds, entries, rebuilt_at) "
            f"SELECT (%s::date - d), t.id, %s, %s, 172800, 330.24, 0, 24, now() "
            f'FROM generate_series(1, %s) AS d CROSS JOIN "{team_t}" AS t '
            f"ORDER BY d DESC, t.id", [NOW.date(), pool.cluster_id, h100.pk, DAYS])  # oldest day first
        cursor.execute(
            f'INSERT INTO "{job_day_t}" (day, job_id, team_id, gpu_seconds, cost_usd, unpriced_gpu_seconds, entries, '
            f"rebuilt_at) SELECT (%s::date - d), a.job_id, j.team_id, 172800, 330.24, 0, 24, now() "
            f'FROM generate_series(1, %s) AS d CROSS JOIN "{attempt_t}" AS a JOIN jobs_job AS j ON j.id = a.job_id '
            f"ORDER BY d DESC, a.id", [NOW.date(), DAYS])
        for table in (entry_t, rollup_t, job_day_t, attempt_t):
            cursor.execute(f'ANALYZE "{table}"')
    return teams


LEDGER_TABLES = (CostEntry._meta.db_table, DailyCostRollup._meta.db_table, JobDailyCost._meta.db_table)


def scans(node: dict):
    """``(node type, relation, index name)`` of every node of an EXPLAIN (FORMAT JSON) plan tree."""
    yield node["Node Type"], node.get("Relation Name"), node.get("Index Name")
    for child in node.get("Plans", []):
        yield from scans(child)


def plans_of(run) -> list[tuple[str, list]]:
    """Run ``run()``; ``[(sql, scans)]`` of every SELECT it sent that reads the ledger or its rollups."""
    with CaptureQueriesContext(connection) as captured:
        run()
    found = []
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.startswith("SELECT") or not any(f'"{t}"' in sql for t in LEDGER_TABLES):
                continue
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            found.append((sql, list(scans(plan[0]["Plan"]))))
    assert found, "the function read neither the ledger nor its rollups"
    return found


def assert_indexed(run, *indexes: str):
    """Every read of the ledger tables by ``run()`` goes through one of ``indexes``, none scans a whole table."""
    for sql, nodes in plans_of(run):
        assert not [n for n in nodes if n[1] in LEDGER_TABLES and n[0] == "Seq Scan"], f"{sql}\n{nodes}"
        assert any(name in indexes for _, _, name in nodes), f"{sql}\n{nodes}"


def index_name(model, fields: list[str]) -> str:
    return next(i.name for i in model._meta.indexes if list(i.fields) == fields)


def test_a_teams_month_of_budget_reads_its_rollups_by_team_and_day(layout):
    month = NOW.replace(day=1, hour=0, minute=0)
    assert_indexed(lambda: period_spend([layout[5].pk], month, NOW.replace(month=7, day=1, hour=0, minute=0)),
                   "costrollup_team_day", "costrollup_unique", "costentry_unpriced")


def test_the_edge_days_of_a_budget_and_the_burn_rate_read_one_teams_recent_entries(layout):
    team = layout[7].pk
    entries_index = index_name(CostEntry, ["team", "interval_start"])
    # A few hours of every team are few rows too: the planner may range over the start alone.
    assert_indexed(lambda: period_spend([team], NOW - dt.timedelta(hours=5), NOW), entries_index, "costentry_start",
                   "costentry_unpriced")
    assert_indexed(lambda: ledger_usd_prorated(team, NOW - dt.timedelta(days=1), NOW), entries_index,
                   "costentry_start")


def test_thirty_days_of_costs_by_team_read_the_rollups_by_day_and_the_edges_by_start(layout):
    assert_indexed(lambda: aggregate_window("team", NOW - dt.timedelta(days=30), NOW),
                   "costrollup_unique", "costentry_start", "costentry_unpriced")


def test_thirty_days_of_costs_by_job_read_the_job_day_rollups_by_day(layout):
    assert_indexed(lambda: aggregate_window("job", NOW - dt.timedelta(days=30), NOW),
                   "jobcost_unique", "costentry_start", "costentry_unpriced")


def test_accrual_finds_the_open_entries_by_attempt_and_recent_start(layout):
    assert_indexed(lambda: accrue_running(until=NOW), "costentry_unique_interval", "costentry_start")


def test_unknown_cost_reads_only_the_unpriced_rows(layout):
    assert_indexed(lambda: unpriced_usage(team_ids=[layout[0].pk]), "costentry_unpriced")
