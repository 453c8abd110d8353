"""Change requests (ADR 0029): ``requests`` lists them; a team admin asks with ``request quota|budget``; staff
``approve`` or ``decline`` them; the requester may ``withdraw`` a pending one."""

from __future__ import annotations

import json

import click

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, out, print_json, table


def asked_for(r: dict) -> str:
    """What a request asks for, in one cell: ``quota 3: nominal_gpus=24`` or ``new budget: amount_usd=20.00``."""
    what = f"{r['kind']} {r['target']}" if r.get("target") else f"new {r['kind']}"
    return what + ": " + ", ".join(f"{k}={v}" for k, v in (r.get("payload") or {}).items())


@api_command("requests", "list quota and budget change requests")
@click.option("--team", help="team slug")
@click.option("--state", type=click.Choice(("pending", "approved", "declined", "withdrawn")), help="only this state")
def requests_(api: Api, team: str | None, state: str | None) -> int:
    """Change requests of the user's teams (every team's for staff), newest first."""
    params = {k: v for k, v in (("team", team), ("state", state)) if v}
    page = api.client.get_pages("change-requests/", params or None)
    if api.shown_as_json(page):
        return EXIT_OK
    if not page["results"]:
        err("no change requests")
        return EXIT_OK
    rows = [[r["id"], r["team"], r["state"], asked_for(r), r.get("requested_by") or "-", r["reason"],
             r.get("decided_by") or "-", r.get("decision_note") or "-"] for r in page["results"]]
    table(["ID", "TEAM", "STATE", "ASKS FOR", "BY", "REASON", "DECIDED BY", "NOTE"], rows, right=("ID",))
    return EXIT_OK


def parse_value(text: str):
    """``--set`` values: JSON when they parse (``8``, ``null``, ``[50, 80]``, ``true``), else the text itself
    (``2500.00`` stays exact text for money, as the API wants it)."""
    if text.replace(".", "", 1).isdigit() and "." in text:
        return text  # a decimal: money, kept exact
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_settings(pairs: tuple[str, ...]) -> dict:
    """``("nominal_gpus=8", ...)`` -> ``{"nominal_gpus": 8, ...}``; a pair without ``=`` is a usage error."""
    payload = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r}: expected FIELD=VALUE", param_hint="--set")
        payload[name.strip()] = parse_value(value.strip())
    return payload


def show(api: Api, body: dict) -> None:
    """A request after a change: its JSON, or one line with its id, state and what it asks for."""
    if api.json:
        print_json(body)
    else:
        out(f"request {body['id']} ({body['team']}): {body['state']}; {asked_for(body)}")


@api_command("request", "ask platform staff for a quota or budget change")
@click.argument("kind", type=click.Choice(("quota", "budget")))
@click.option("--team", required=True, help="team slug")
@click.option("--target", type=click.IntRange(min=1), help="id of the quota or budget to change (none: a new one)")
@click.option("--set", "settings", multiple=True, required=True, metavar="FIELD=VALUE",
              help="a requested value, e.g. nominal_gpus=8 or amount_usd=2500.00 (repeat for more)")
@click.option("--reason", required=True, help="why the team needs the change")
def request(api: Api, kind: str, team: str, target: int | None, settings: tuple[str, ...], reason: str) -> int:
    """Request a change of the team's ``kind`` (``--target`` ID) or a new one, with ``--set`` values and a reason."""
    body = {"team": team, "kind": kind, "target": target, "payload": parse_settings(settings), "reason": reason}
    show(api, api.client.post("change-requests/", body))
    return EXIT_OK


def request_id(fn):
    """The ``ID`` argument: a change request id (from ``cpctl requests``)."""
    return click.argument("id", metavar="ID", type=int)(fn)


@api_command("approve", "staff: approve a change request and apply it")
@request_id
@click.option("--note", default="", help="a note for the requester")
def approve(api: Api, id: int, note: str) -> int:  # noqa: A002 - the argument's name in the usage line
    """Approve request ``id``: its values are applied now (exit 6 when its object changed since)."""
    show(api, api.client.post(f"change-requests/{id}/approve/", {"note": note}))
    return EXIT_OK


@api_command("decline", "staff: decline a change request with a note")
@request_id
@click.option("--note", required=True, help="why, mailed to the requester")
def decline(api: Api, id: int, note: str) -> int:  # noqa: A002
    """Decline request ``id`` with ``note``."""
    show(api, api.client.post(f"change-requests/{id}/decline/", {"note": note}))
    return EXIT_OK


@api_command("withdraw", "withdraw your pending change request")
@request_id
def withdraw(api: Api, id: int) -> int:  # noqa: A002
    """Withdraw request ``id`` (the requester's own, pending)."""
    show(api, api.client.post(f"change-requests/{id}/withdraw/", {}))
    return EXIT_OK


COMMANDS = [requests_, request, approve, decline, withdraw]
