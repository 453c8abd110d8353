"""The audit trail (ADR 0031): ``audit`` lists who changed which quota, budget, cohort, price, cluster, node
cordon, membership or role, or decided which change request, when, from what to what, and why."""

from __future__ import annotations

import json

import click

from cpctl.commands.costs import as_api_time
from cpctl.errors import EXIT_OK
from cpctl.options import POSITIVE_INT, Api, api_command
from cpctl.output import err, table, when

OBJECT_TYPES = ("quota", "budget", "team", "cohort", "priorityclass", "membership", "price", "electricityprice",
                "cluster", "nodepool", "node", "changerequest")
ACTIONS = ("created", "updated", "deleted", "approved", "declined", "cordoned", "drained", "uncordoned", "cleared")


def _shown(values: dict, name: str) -> str:
    return json.dumps(values[name], ensure_ascii=False) if name in values else "-"


def changed(record: dict) -> str:
    """The fields a record changed, in one cell, values as JSON: ``nominal_gpus: 8 -> 16; amount_usd: "10.00" ->
    "20.00"`` (``-``: absent, as before a creation; ``-`` alone: nothing changed)."""
    before, after = record.get("before") or {}, record.get("after") or {}
    names = list(before) + [name for name in after if name not in before]
    parts = [f"{name}: {_shown(before, name)} -> {_shown(after, name)}" for name in names
             if before.get(name) != after.get(name) or (name in before) != (name in after)]
    return "; ".join(parts) or "-"


@api_command("audit", "list the audit trail: who changed what, when, before and after, why")
@click.option("--team", help="team slug")
@click.option("--type", "object_type", type=click.Choice(OBJECT_TYPES), help="only changes of this kind of object")
@click.option("--object-id", type=POSITIVE_INT, help="only changes of this object (with --type)")
@click.option("--actor", help="only changes by this username")
@click.option("--action", type=click.Choice(ACTIONS), help="only this action")
@click.option("--since", help="ISO 8601 datetime with offset, or a date (midnight UTC); inclusive")
@click.option("--until", help="ISO 8601 datetime with offset, or a date (midnight UTC); exclusive")
@click.option("--limit", type=POSITIVE_INT, default=50, help="at most this many records (default 50)")
def audit(api: Api, team: str | None, object_type: str | None, object_id: int | None, actor: str | None,
          action: str | None, since: str | None, until: str | None, limit: int) -> int:
    """Audit records, newest first: every team's for staff, the user's teams' for anyone else."""
    params = {k: v for k, v in (("team", team), ("object_type", object_type), ("object_id", object_id),
                                ("actor", actor), ("action", action), ("since", as_api_time(since)),
                                ("until", as_api_time(until))) if v}
    page = api.client.get_pages("audit/", params or None, limit=limit)
    if api.shown_as_json(page):
        return EXIT_OK
    if not page["results"]:
        err("no audit records")
        return EXIT_OK
    rows = [[r["id"], when(r["at"]), r.get("actor") or "system", r["action"],
             f"{r['object_type']} {r['object_id']}: {r['object_repr']}", r.get("team") or "-", changed(r),
             r.get("reason") or "-"] for r in page["results"]]
    table(["ID", "AT (UTC)", "ACTOR", "ACTION", "OBJECT", "TEAM", "CHANGED", "REASON"], rows, right=("ID",))
    if page["count"] > len(page["results"]):
        err(f"({len(page['results'])} of {page['count']} records; --limit shows more)")
    return EXIT_OK


COMMANDS = [audit]
