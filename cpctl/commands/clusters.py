"""``cpctl clusters``: each cluster's health, since when and why, last contact and its node pools' GPUs."""

from __future__ import annotations

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, out, table, when

#: The line under the table saying what its GPU column counts: the pools' capacity, not every node's GPUs.
POOL_GPUS_NOTE = ("POOL GPUS: each node pool's nodes x GPUs per node, summed; GPUs shared by time-slicing, MPS or "
                  "MIG may be outside it: `cpctl nodes` lists every GPU node's physical GPUs")


@api_command("clusters", "list clusters: health, since when and why, last contact, node pools' GPUs")
def clusters(api: Api) -> int:
    """Every cluster: where it is, its health, since when (UTC) and why it is not healthy, last contact, and its
    node pools' GPUs (``capacity_gpus`` summed), then a line saying what that column counts (``POOL_GPUS_NOTE``)."""
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
    table(["CLUSTER", "WHERE", "HEALTH", "SINCE", "LAST CONTACT", "POOL GPUS", "WHY"], rows, right=("POOL GPUS",))
    out(POOL_GPUS_NOTE)
    return EXIT_OK


COMMANDS = [clusters]
