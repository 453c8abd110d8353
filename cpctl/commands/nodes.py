"""Node commands: ``nodes`` (health and its evidence); staff's ``cordon``, ``drain``, ``uncordon`` and
``clear-health``."""

from __future__ import annotations

import click

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, out, print_json, table


@api_command("nodes", "list GPU nodes with their health and its evidence")
@click.option("--cluster", help="cluster name")
@click.option("--health", type=click.Choice(("healthy", "suspect", "unhealthy")), help="only nodes of this health")
def nodes(api: Api, cluster: str | None, health: str | None) -> int:
    """GPU nodes of every cluster with their health, whether admission may use them, and the evidence."""
    params = {k: v for k, v in (("cluster", cluster), ("health", health)) if v}
    page = api.client.get_pages("nodes/", params or None)
    if api.shown_as_json(page):
        return EXIT_OK
    if not page["results"]:
        err("no nodes")
        return EXIT_OK
    rows = [[n["id"], n["cluster"], n["name"], n.get("node_pool") or "-", n["gpus"], n["health"],
             "yes" if n.get("takes_work") else "no" + (" (cordoned)" if n.get("cordoned") else ""),
             "; ".join(e.get("message", "") for e in n.get("health_evidence") or []) or "-"]
            for n in page["results"]]
    table(["ID", "CLUSTER", "NODE", "POOL", "GPUS", "HEALTH", "TAKES WORK", "EVIDENCE"], rows, right=("ID", "GPUS"))
    return EXIT_OK


def node_action(api: Api, node: int, action: str, note: str | None = None, reason: str | None = None) -> int:
    """POST ``nodes/<node>/<action>/`` (staff: cordon, drain, uncordon, clear; ``reason`` for the audit trail) and
    print the node's health afterwards (after a drain, also how many attempts were preempted)."""
    body = api.client.post(f"nodes/{node}/{action}/", {"note": note} if note else {}, reason=reason)
    if api.json:
        print_json(body)
    else:
        out(f"node {body['cluster']}/{body['name']}: {body['health']}, "
            + ("cordoned" if body.get("cordoned") else "not cordoned")
            + (", takes work" if body.get("takes_work") else ", takes no work")
            + (f"; {body['preempted_attempts']} attempt(s) preempted, no retry used"
               if "preempted_attempts" in body else ""))
    return EXIT_OK


def node_id(fn):
    """The ``ID`` argument: a node id (from ``cpctl nodes``)."""
    return click.argument("id", metavar="ID", type=int)(fn)


@api_command("cordon", "staff: keep admission off a node (Kubernetes untouched)")
@node_id
@click.option("--note", help="why, shown next to the node and kept in the audit trail")
def cordon(api: Api, id: int, note: str | None) -> int:  # noqa: A002 - the argument's name in the usage line
    """Keep admission off node ``id``; ``note`` says why."""
    return node_action(api, id, "cordon", note)


@api_command("drain", "staff: cordon a node and preempt the work on it (no retry used)")
@node_id
@click.option("--note", help="why, shown next to the node and kept in the audit trail")
@click.option("--reason", help="why, kept in the audit trail (when no --note is given)")
def drain(api: Api, id: int, note: str | None, reason: str | None) -> int:  # noqa: A002
    """Cordon node ``id`` and end its live attempts as Preempted; their jobs go back to admission elsewhere."""
    return node_action(api, id, "drain", note, reason=reason)


@api_command("uncordon", "staff: let admission use a cordoned node again")
@node_id
@click.option("--reason", help="why, kept in the audit trail")
def uncordon(api: Api, id: int, reason: str | None) -> int:  # noqa: A002
    """Let admission use node ``id`` again."""
    return node_action(api, id, "uncordon", reason=reason)


@api_command("clear-health", "staff: clear a node's health evidence")
@node_id
@click.option("--reason", help="why, kept in the audit trail")
def clear_health(api: Api, id: int, reason: str | None) -> int:  # noqa: A002
    """Clear node ``id``'s health evidence (it becomes healthy)."""
    return node_action(api, id, "clear", reason=reason)


COMMANDS = [nodes, cordon, drain, uncordon, clear_health]
