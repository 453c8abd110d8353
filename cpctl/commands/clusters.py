"""``cpctl clusters``: each cluster's health, since when and why, last contact and GPUs."""

from __future__ import annotations

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, table, when


@api_command("clusters", "list clusters: health, since when and why, last contact, GPUs")
def clusters(api: Api) -> int:
    """Every cluster: where it is, its health, since when (UTC) and why it is not healthy, last contact, GPUs."""
    page = api.client.get_pages("clusters/")
    if api.shown_as_json(page):
        return EXIT_OK
    if not page["results"]:
        err("no clusters")
        return EXIT_OK
    rows = [[c["name"], f"{c['provider']}/{c['region']}", c["health"], when(c.get("health_since")),
             when(c["last_contact_at"]) if c.get("last_contact_at") else "never",
             sum(p["capacity_gpus"] for p in c.get("node_pools", [])), c.get("health_reason") or "-"]
            for c in page["results"]]
    table(["CLUSTER", "WHERE", "HEALTH", "SINCE", "LAST CONTACT", "GPUS", "WHY"], rows, right=("GPUS",))
    return EXIT_OK


COMMANDS = [clusters]
