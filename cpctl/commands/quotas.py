"""``cpctl quotas``: GPU quotas in GPUs and CPU quotas in vCPUs."""

from __future__ import annotations

import click

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, table


def quota_row(q: dict) -> list:
    """A quota as a table row: GPUs, or vCPUs for a CPU quota (accelerator ``CPU``), with the unit. LIMIT is
    nominal + borrowing limit; REACHABLE what the team can actually hold (at most nominal + what its cohort can
    lend it), the number admission, the preview and a waiting job's reason use."""
    unit = "vcpus" if q["accelerator"] == "CPU" else "gpus"
    return [q["team"], q["accelerator"], q.get("cluster") or "all", q.get(f"nominal_{unit}"),
            q.get(f"borrowing_limit_{unit}"), q.get(f"limit_{unit}"), q.get(f"reachable_{unit}"),
            q.get(f"max_{unit}_per_job") or "-", "vCPUs" if unit == "vcpus" else "GPUs"]


@api_command("quotas", "list GPU quotas and CPU quotas (vCPUs)")
@click.option("--team", help="team slug")
def quotas(api: Api, team: str | None) -> int:
    """GPU quotas of the user's teams, and CPU quotas (accelerator CPU) in vCPUs."""
    page = api.client.get_pages("quotas/", {"team": team} if team else None)
    if api.shown_as_json(page):
        return EXIT_OK
    rows = [quota_row(q) for q in page["results"]]
    if not rows:
        err("no quotas")
        return EXIT_OK
    table(["TEAM", "ACCELERATOR", "CLUSTER", "NOMINAL", "BORROWING", "LIMIT", "REACHABLE", "MAX/JOB", "UNIT"], rows,
          right=("NOMINAL", "BORROWING", "LIMIT", "REACHABLE", "MAX/JOB"))
    return EXIT_OK


COMMANDS = [quotas]
