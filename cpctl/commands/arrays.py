"""Job array commands: ``arrays`` (the list) and ``array ID`` / ``array cancel ID``; ``submit`` sends a document with
an ``array:`` field here (``submit_array``)."""

from __future__ import annotations

import datetime as dt
import json
import time

import click

from cpctl.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_JOB_NOT_SUCCEEDED, EXIT_OK, CliError
from cpctl.options import POSITIVE_INT, Api, api_command
from cpctl.output import age, err, fields, money, out, print_json, table, when

#: An array's statuses after which nothing changes any more.
FINAL_STATUSES = ("succeeded", "failed", "cancelled")
#: The counts ``cpctl`` shows, in this order (the others are shown when not zero).
SHOWN_COUNTS = ("queued", "running", "succeeded", "failed", "cancelled")


def parsed_document(raw: bytes, media_type: str) -> dict | None:
    """The submission document ``raw`` as a mapping, or None when it does not parse as one (the API then says
    what is wrong with it)."""
    import yaml  # PyYAML, a runtime dependency; only needed to look into a document

    try:
        document = json.loads(raw) if media_type == "application/json" else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError):
        return None
    return document if isinstance(document, dict) else None


def counts_line(array: dict) -> str:
    """``queued 42, running 8, succeeded 0, failed 0, cancelled 0`` (and any other state with elements)."""
    counts = array.get("counts") or {}
    shown = [k for k in SHOWN_COUNTS] + [k for k, v in counts.items() if k not in SHOWN_COUNTS and v]
    return ", ".join(f"{k} {counts.get(k, 0)}" for k in shown)


def submit_array(api: Api, raw: bytes, media_type: str, document: dict, wait: bool, interval: float,
                 dry_run: bool, show_preview) -> int:
    """``cpctl submit`` of a document with ``array:``: POST it to ``arrays/`` and print the array's id, size and
    status; with ``--wait`` follow it until its status is final (exit 0 only when every element succeeded). With
    ``--dry-run`` the template (the document without ``array``) is previewed as one element, printed by
    ``show_preview`` (``submit``'s printer of a preview)."""
    if dry_run:
        template = {k: v for k, v in document.items() if k != "array"}
        preview = api.client.json("POST", "jobs/preview/", data=json.dumps(template).encode(),
                                  content_type="application/json")
        if api.json:
            print_json(preview)
        else:
            out("each element of the array:")
            show_preview(preview)
        return EXIT_BAD_INPUT if preview["outcome"] == "refused" else EXIT_OK
    array = api.client.json("POST", "arrays/", data=raw, content_type=media_type)
    if api.json and not wait:
        print_json(array)
        return EXIT_OK
    say = err if api.json else out
    say(f"array {array['id']} submitted: {array['name']} (team {array['team']}), {array['count']} elements, at most "
        f"{array['parallelism']} at once, {array['status']}")
    if not wait:
        return EXIT_OK
    try:
        seen = None
        while array["status"] not in FINAL_STATUSES:
            line = f"array {array['id']}: {array['status']} ({counts_line(array)})"
            if line != seen:
                say(line)
                seen = line
            time.sleep(interval)
            array = api.client.get(f"arrays/{array['id']}/")
    except KeyboardInterrupt:
        raise CliError(EXIT_INTERRUPTED, f"stopped following array {array['id']}; it keeps running (cancel it "
                                         f"with: cpctl array cancel {array['id']})") from None
    say(f"array {array['id']}: {array['status']} ({counts_line(array)}), cost {money(array)}")
    if api.json:
        print_json(array)
    return EXIT_OK if array["status"] == "succeeded" else EXIT_JOB_NOT_SUCCEEDED


@api_command("arrays", "list job arrays, newest first")
@click.option("--team", help="team slug")
@click.option("--limit", type=POSITIVE_INT, default=50, help="at most this many arrays (default 50)")
def arrays(api: Api, team: str | None, limit: int) -> int:
    """The array list (newest first): id, team, name, status, elements, parallelism, counts, cost, age."""
    page = api.client.get_pages("arrays/", {"team": team} if team else {}, limit=limit)
    if api.shown_as_json(page):
        return EXIT_OK
    found = page["results"]
    if not found:
        err("no arrays")
        return EXIT_OK
    now = dt.datetime.now(dt.timezone.utc)
    table(["ID", "TEAM", "NAME", "STATUS", "COUNT", "PARALLEL", "QUEUED", "RUNNING", "DONE", "FAILED", "COST", "AGE"],
          [[a["id"], a["team"], a["name"], a["status"], a["count"], a["parallelism"], a["counts"].get("queued", 0),
            a["counts"].get("running", 0), a["counts"].get("succeeded", 0), a["counts"].get("failed", 0),
            money(a), age(a.get("created_at"), now)] for a in found],
          right=("ID", "COUNT", "PARALLEL", "QUEUED", "RUNNING", "DONE", "FAILED", "COST", "AGE"))
    if page["count"] > len(found):
        err(f"({len(found)} of {page['count']} arrays; --limit shows more)")
    return EXIT_OK


def _array_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise click.UsageError(f"{text!r} is not an array id (a positive integer); usage: cpctl array ID, or cpctl "
                               f"array cancel ID")
    return value


@api_command("array", "show a job array (array ID), or cancel it (array cancel ID)")
@click.argument("words", metavar="[cancel] ID", nargs=-1, required=True)
def array(api: Api, words: tuple[str, ...]) -> int:
    """``array ID``: status, counts, cost and the grid of one array; ``array cancel ID``: cancel every element,
    running ones too, and make no more."""
    if words[0] == "cancel":
        if len(words) != 2:
            raise click.UsageError("usage: cpctl array cancel ID")
        body = api.client.post(f"arrays/{_array_id(words[1])}/cancel/")
        if api.json:
            print_json(body)
        else:
            out(f"array {body['id']}: {body['status']} ({counts_line(body)})")
        return EXIT_OK
    if len(words) != 1:
        raise click.UsageError("usage: cpctl array ID, or cpctl array cancel ID")
    body = api.client.get(f"arrays/{_array_id(words[0])}/")
    if api.shown_as_json(body):
        return EXIT_OK
    out(f"array {body['id']}  {body['name']}")
    pairs = [("team", f"{body['team']} (submitted by {body.get('submitter')})"),
             ("status", body["status"]),
             ("elements", f"{body['count']}, at most {body['parallelism']} at once ({body['materialized']} made so "
                          f"far)"),
             ("counts", counts_line(body)),
             ("cost", money(body))]
    if body.get("grid"):
        pairs.append(("grid", ", ".join(f"{k}={json.dumps(v)}" for k, v in body["grid"].items())))
    pairs.append(("submitted", f"{when(body.get('created_at'))} UTC"))
    fields(pairs)
    return EXIT_OK


COMMANDS = [arrays, array]
