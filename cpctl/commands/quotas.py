"""``cpctl quotas``: GPU quotas in GPUs and CPU quotas in vCPUs; ``cpctl fair-share``: each team's decayed usage."""

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




def tree_rows(node: dict, depth: int = 0) -> list[list]:
    """A tree of cohorts (``GET cohort-trees/``'s shape) as table rows, depth first: each cohort, then its teams,
    then its child cohorts, indented two spaces a level; one row per accelerator (``-`` where a figure is not the
    reader's to see: another team's, or a level's sum over teams the reader may not all see). Columns: LEVEL,
    ACCELERATOR, NOMINAL (its own), IN SUBTREE (nominal inside it),
    BORROWING LIMIT, LENDING LIMIT, USED (summed over its subtree) and AVAILABLE (a team's room now)."""
    pad = "  " * depth
    rows = [[f"{pad}{node['name']}", a["accelerator"], a["nominal_gpus"], a["nominal_in_subtree_gpus"],
             a["borrowing_limit_gpus"] if a["borrowing_limit_gpus"] is not None else "none",
             a["lending_limit_gpus"] if a["lending_limit_gpus"] is not None else "all", a["used_gpus"], None]
            for a in node["accelerators"]] or [[f"{pad}{node['name']}", None, None, None, None, None, None, None]]
    for team in node["teams"]:
        hidden = team["accelerators"] and team["accelerators"][0]["nominal_gpus"] is None  # not the reader's team
        rows += [[f"{pad}  team {team['slug']}", a["accelerator"], a["nominal_gpus"], a["nominal_gpus"],
                  a["borrowing_limit_gpus"], None if hidden else a["lending_limit_gpus"]
                  if a["lending_limit_gpus"] is not None else "all", a["used_gpus"], a["available_gpus"]]
                 for a in team["accelerators"]]
    for child in node["children"]:
        rows += tree_rows(child, depth + 1)
    return rows


@api_command("cohorts", "trees of cohorts: each level's quota, limits and usage")
@click.option("--cohort", "cohort_id", type=int, help="the subtree of this cohort id only")
def cohorts(api: Api, cohort_id: int | None) -> int:
    """Trees of cohorts (organisation > department > team, ADR 0046): per level and accelerator its own nominal
    quota, the nominal inside its subtree, its borrowing and lending limits and the GPUs its subtree holds."""
    body = api.client.get(f"cohort-trees/{cohort_id}/" if cohort_id is not None else "cohort-trees/")
    if api.shown_as_json(body):
        return EXIT_OK
    trees = [body] if cohort_id is not None else body
    rows = [row for tree in trees for row in tree_rows(tree)]
    if not rows:
        err("no cohorts yet: every team shares the default cohort (cpctl fair-share shows it); staff make cohorts")
        return EXIT_OK
    table(["LEVEL", "ACCELERATOR", "NOMINAL", "IN SUBTREE", "BORROWING LIMIT", "LENDING LIMIT", "USED", "AVAILABLE"],
          rows, right=("NOMINAL", "IN SUBTREE", "BORROWING LIMIT", "LENDING LIMIT", "USED", "AVAILABLE"))
    return EXIT_OK




@api_command("fair-share", "each team's decayed GPU-hours, weight and cohort share, in the scheduler's order")
def fair_share(api: Api) -> int:
    """The user's teams (staff: all) as fair sharing over time ranks them (docs/adr/0045): decayed GPU-hours,
    weight, decayed GPU-hours per unit of weight (lowest goes first at equal priority) and the team's part of its
    cohort's weighted decayed usage, with the half-life."""
    body = api.client.get("fair-sharing/")
    if api.shown_as_json(body):
        return EXIT_OK
    half_life = body["half_life_seconds"]
    if not half_life:
        err("fair sharing over time is off (half-life 0): teams are ordered by what they run now")
    else:
        err(f"half-life {half_life} s ({half_life / 86400:g} days), as of {body['at']}")
    rows = [[r["team"], r["cohort"] or "default", r["decayed_gpu_hours"], r["weight"], r["weighted_gpu_hours"],
             "-" if r["cohort_share"] is None else f"{float(r['cohort_share']) * 100:.1f}%"]
            for r in body["results"]]
    if not rows:
        err("no teams")
        return EXIT_OK
    table(["TEAM", "COHORT", "DECAYED GPU-H", "WEIGHT", "PER WEIGHT", "COHORT SHARE"], rows,
          right=("DECAYED GPU-H", "WEIGHT", "PER WEIGHT", "COHORT SHARE"))
    return EXIT_OK


COMMANDS = [quotas, cohorts, fair_share]
