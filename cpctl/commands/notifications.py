"""Notifications (docs/adr/0035-notifications.md): ``subscriptions`` lists yours and your teams';
``subscribe`` makes one (yours, or a team's with ``--team``: its admins); ``unsubscribe`` deletes one;
``notifications`` is the delivery log."""

from __future__ import annotations

import click

from cpctl.errors import EXIT_OK
from cpctl.options import Api, api_command
from cpctl.output import err, out, print_json, table, when

EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.preempted", "job.recovered", "budget.threshold")


def target(s: dict) -> str:
    """Where a subscription sends: its address (``your address`` when blank), or its webhook's scheme and host."""
    if s["channel"] == "webhook":
        return s.get("webhook") or "-"
    return s.get("email") or "your address"


@api_command("subscriptions", "list your and your teams' notification subscriptions")
def subscriptions(api: Api) -> int:
    """Every subscription you see: yours (TEAM -) and your teams', with their events and where they send."""
    page = api.client.get_pages("subscriptions/")
    if api.shown_as_json(page):
        return EXIT_OK
    if not page["results"]:
        err("no subscriptions")
        return EXIT_OK
    rows = [[s["id"], s.get("team") or "-", s["channel"], target(s), ",".join(s["events"]),
             "yes" if s["active"] else "no"] for s in page["results"]]
    table(["ID", "TEAM", "CHANNEL", "SENDS TO", "EVENTS", "ACTIVE"], rows, right=("ID",))
    return EXIT_OK


@api_command("subscribe", "subscribe yourself or a team (its admins) to notifications")
@click.option("--event", "events", multiple=True, required=True, type=click.Choice(EVENTS),
              help="an event to be told of (repeat for more)")
@click.option("--team", help="team slug: the team's subscription (team admins); none: your own")
@click.option("--email", help="e-mail address (your own subscription: default your address)")
@click.option("--webhook", "webhook_url", help="http(s) URL to POST Slack-compatible JSON to")
@click.option("--secret", help="key of the X-Controlplane-Signature-256 HMAC (prefer a variable: options show in ps)")
@click.option("--only-own-jobs", is_flag=True, help="job events of the jobs you submitted only (your own)")
def subscribe(api: Api, events: tuple[str, ...], team: str | None, email: str | None, webhook_url: str | None,
              secret: str | None, only_own_jobs: bool) -> int:
    """Make a subscription: a webhook with ``--webhook``, else e-mail."""
    body = {"channel": "webhook" if webhook_url else "email", "events": list(events)}
    for name, value in (("team", team), ("email", email), ("webhook_url", webhook_url), ("secret", secret)):
        if value:
            body[name] = value
    if only_own_jobs:
        body["only_own_jobs"] = True
    made = api.client.post("subscriptions/", body)
    if api.json:
        print_json(made)
    else:
        out(f"subscription {made['id']} ({made.get('team') or 'yours'}): {made['channel']} to {target(made)}; "
            f"{','.join(made['events'])}")
    return EXIT_OK


@api_command("unsubscribe", "delete a notification subscription")
@click.argument("id", metavar="ID", type=int)
def unsubscribe(api: Api, id: int) -> int:  # noqa: A002 - the argument's name in the usage line
    """Delete subscription ``id`` (yours, or your team's as its admin)."""
    api.client.delete(f"subscriptions/{id}/")
    if not api.json:
        out(f"subscription {id} deleted")
    return EXIT_OK


@api_command("notifications", "the delivery log of your and your teams' notifications")
@click.option("--status", type=click.Choice(("pending", "queued", "sending", "sent", "failed")), help="only this")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="at most this many")
def notifications(api: Api, status: str | None, limit: int) -> int:
    """Notifications, newest first: event, team, channel, status, attempts, when sent, the last error."""
    page = api.client.get_pages("notifications/", {"status": status} if status else None, limit=limit)
    if api.shown_as_json(page):
        return EXIT_OK
    if not page["results"]:
        err("no notifications")
        return EXIT_OK
    rows = [[n["id"], n["event"], n.get("team") or "-", n["channel"], n["status"], n["attempts"],
             when(n["sent_at"]) if n.get("sent_at") else "-", n.get("last_error") or "-"] for n in page["results"]]
    table(["ID", "EVENT", "TEAM", "CHANNEL", "STATUS", "TRIES", "SENT", "LAST ERROR"], rows, right=("ID", "TRIES"))
    return EXIT_OK


COMMANDS = [subscriptions, subscribe, unsubscribe, notifications]
