"""``cpctl``: submit and follow jobs, read quotas, budgets and costs, through the control plane's REST API.

Run it as ``cpctl COMMAND ...`` (``make install`` puts it in ``.venv/bin``) or ``python -m cpctl COMMAND ...``.
It talks HTTP to ``/api/v1/`` only, so it needs no database access: a URL and
an API token.

Configuration (an option wins over the environment):

  --url URL      or CONTROLPLANE_URL     default http://127.0.0.1:8000
  --token=KEY    or CONTROLPLANE_TOKEN   sent as ``Authorization: Token KEY``; never printed
                                         (prefer the variable: options show in ``ps``)

Commands::

  submit FILE [--team T] [--name N] [--wait]   YAML (application/yaml) or JSON (.json); "-" reads stdin
  jobs [--team T] [--state S ...] [--limit N]  a table: id, team, name, state, GPUs, accelerator, cost, age
  job ID                                       details, with why a queued job waits and its queue position
  events ID                                    the job's timeline
  efficiency ID                                the job's throughput (last, run), loss, MFU, tokens per attempt
  logs ID [--node N] [--tail N] [--follow]     the current attempt's log of one node
  cancel ID
  quotas [--team T]                            GPU quotas and CPU quotas (vCPUs)
  clusters                                     clusters: health, since when and why, last contact, GPUs
  budgets [--team T]                           budgets' current period: spent, committed, remaining, forecast
  costs [--group-by team|cluster|accelerator|job|day] [--start S] [--end E] [--team T]
  utilization [--group-by ...] [--start S] [--end E] [--team T]
                                               average GPU utilization, coverage, idle GPU-hours and USD
  reports [--team T] [--kind daily|weekly|custom] [--limit N]   stored reports, newest first
  report ID [--csv]                            one report's figures, or its CSV (section,item,metric,value)
  nodes [--cluster C] [--health H]             GPU nodes: health, whether they take work, the evidence
  cordon ID [--note N] | uncordon ID | clear-health ID
                                               staff: keep admission off a node, let it back, clear its health

``--json`` (every command) prints the API's JSON instead of a table; list
commands print the API's page shape ``{"count", "next", "previous",
"results"}`` with every page fetched up to the limit.

Exit codes:

  0    success
  1    ``submit --wait``: the job ended in a state other than SUCCEEDED
  2    bad input: the API answered 400 (each field path and its reason are printed,
       one per line), or the command line or the file is wrong
  3    401: no token, or an unknown or expired one
  4    403: the token's user may not do this (e.g. cancel another member's job)
  5    404: no such object, or one of another team (the API does not tell them apart)
  6    409: conflict, e.g. cancelling a job that is already final
  7    the API cannot be reached (connection refused, name not found, timeout)
  8    any other unexpected answer (5xx, a 503 from an unreachable cluster, not JSON)
  130  interrupted (Ctrl-C); a followed job keeps running
"""

from __future__ import annotations

import argparse
import codecs
import datetime as dt
import json
import math
import os
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests

DEFAULT_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1/"
USER_AGENT = "cpctl/1"
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")
GROUP_BY_CHOICES = ("team", "cluster", "accelerator", "job", "day")
MAX_PAGE = 1000  # the API's max_limit

EXIT_OK = 0
EXIT_JOB_NOT_SUCCEEDED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAUTHORIZED = 3
EXIT_FORBIDDEN = 4
EXIT_NOT_FOUND = 5
EXIT_CONFLICT = 6
EXIT_UNREACHABLE = 7
EXIT_UNEXPECTED = 8
EXIT_INTERRUPTED = 130

EXIT_BY_STATUS = {400: EXIT_BAD_INPUT, 401: EXIT_UNAUTHORIZED, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND,
                  409: EXIT_CONFLICT}


# --- errors -----------------------------------------------------------------------------------------------------------

class CliError(Exception):
    """A failure to report on stderr (``lines``, one message each) and end with ``exit_code``."""

    def __init__(self, exit_code: int, *lines: str):
        super().__init__(lines[0] if lines else "")
        self.exit_code = exit_code
        self.lines = lines


def flatten_errors(detail, prefix: str = "") -> list[tuple[str, str]]:
    """A 400 body as ``[(field path, reason)]``: nested objects and lists become dotted paths (``spec.command.1``).

    The job API already answers with flat dotted paths; other endpoints answer
    DRF's nested shape, flattened here the same way.
    """
    if isinstance(detail, dict):
        pairs = []
        for key, value in detail.items():
            path = f"{prefix}.{key}" if prefix and key != "non_field_errors" else (prefix or str(key))
            pairs.extend(flatten_errors(value, path))
        return pairs
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return [(prefix, str(item)) for item in detail]
        pairs = []
        for index, item in enumerate(detail):
            if item:
                pairs.extend(flatten_errors(item, f"{prefix}.{index}" if prefix else str(index)))
        return pairs
    return [(prefix, str(detail))]


def api_error(response: requests.Response) -> CliError:
    """The CliError for an HTTP error answer: the API's detail (or every field error of a 400) and the exit code."""
    status = response.status_code
    code = EXIT_BY_STATUS.get(status, EXIT_UNEXPECTED)
    try:
        body = response.json()
    except ValueError:
        body = None
    if body is None:
        hint = " (is --url the control plane?)" if status == 404 else ""
        return CliError(code, f"error: HTTP {status} {response.reason or ''} from {redact(response.url)}{hint}".rstrip())
    if isinstance(body, dict) and set(body) == {"detail"}:
        lines = [f"error: {body['detail']} (HTTP {status})"]
    elif status == 400:
        lines = ["error: the API refused the request (HTTP 400):"]
        lines += [f"{path or 'request'}: {reason}" for path, reason in flatten_errors(body)]
    else:
        lines = [f"error: HTTP {status}: {json.dumps(body)}"]
    if status == 401:
        lines.append("hint: set CONTROLPLANE_TOKEN (or --token) to a valid API token")
    return CliError(code, *lines)


def redact(url: str) -> str:
    """``url`` without any ``user:password@`` part and without its query string."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# --- HTTP -------------------------------------------------------------------------------------------------------------

class Client:
    """A small HTTP client of ``/api/v1/`` with token authentication; errors become CliError."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0):
        base = url.strip().rstrip("/").removesuffix("/api/v1")
        if "://" not in base:
            base = "http://" + base
        self.base_url = base
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({"Accept": "application/json", "User-Agent": USER_AGENT})
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def request(self, method: str, path: str, *, params=None, data=None, content_type: str | None = None,
                stream: bool = False, read_timeout: float | None | bool = False) -> requests.Response:
        """Send ``method`` to ``/api/v1/<path>``; returns the 2xx response, raises CliError otherwise."""
        headers = {"Content-Type": content_type} if content_type else {}
        timeout = (self.timeout, self.timeout if read_timeout is False else read_timeout)
        try:
            response = self.session.request(method, self.base_url + API_PREFIX + path, params=params, data=data,
                                            headers=headers, stream=stream, timeout=timeout)
        except requests.exceptions.Timeout:
            raise CliError(EXIT_UNREACHABLE, f"error: the control plane at {redact(self.base_url)} did not answer "
                                             f"within {self.timeout:g} s") from None
        except requests.exceptions.ConnectionError:
            raise CliError(EXIT_UNREACHABLE, f"error: cannot reach the control plane at {redact(self.base_url)}: "
                                             "is it running? Set --url or CONTROLPLANE_URL") from None
        except requests.exceptions.RequestException as exc:
            raise CliError(EXIT_UNREACHABLE, f"error: bad control plane URL {redact(self.base_url)}: "
                                             f"{type(exc).__name__}") from None
        if response.status_code >= 400:
            raise api_error(response)
        return response

    def json(self, method: str, path: str, **kwargs):
        """``request`` and decode the JSON body (CliError with EXIT_UNEXPECTED when it is not JSON)."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise CliError(EXIT_UNEXPECTED, f"error: the answer from {redact(response.url)} is not JSON "
                                            "(is --url the control plane?)") from None

    def get(self, path: str, params=None):
        """GET ``path`` and return its JSON."""
        return self.json("GET", path, params=params)

    def get_pages(self, path: str, params=None, limit: int | None = None) -> dict:
        """Every item of a paginated list (at most ``limit``), as one page: ``{"count", "next", "previous", "results"}``.

        Pages by ``limit``/``offset`` itself rather than following ``next``,
        whose host is whatever the server thinks it is (a proxy may differ).
        """
        params = dict(params or {})
        results: list = []
        count, more = 0, None
        while True:
            want = MAX_PAGE if limit is None else min(MAX_PAGE, limit - len(results))
            page = self.get(path, {**params, "limit": want, "offset": len(results)})
            if not isinstance(page, dict) or "results" not in page:  # not paginated
                return page
            results.extend(page["results"])
            count, more = page.get("count", len(results)), page.get("next")
            if not more or not page["results"] or (limit is not None and len(results) >= limit):
                break
        return {"count": count, "next": more, "previous": None, "results": results}


# --- presentation -----------------------------------------------------------------------------------------------------

def out(text: str = "") -> None:
    """Print a line on stdout (looked up at call time, so callers and tests may redirect it)."""
    print(text, file=sys.stdout)


def err(text: str) -> None:
    """Print a line on stderr."""
    print(text, file=sys.stderr)


def print_json(data) -> None:
    """``data`` as indented JSON on stdout."""
    out(json.dumps(data, indent=2, ensure_ascii=False))


def table(headers: list[str], rows: list[list], right: tuple[str, ...] = ()) -> None:
    """Print ``rows`` under ``headers`` in aligned columns (None shows as ``-``); columns in ``right`` align right."""
    cells = [["-" if value is None else str(value) for value in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(values):
        return "  ".join(v.rjust(w) if h in right else v.ljust(w)
                         for v, w, h in zip(values, widths, headers)).rstrip()

    out(line(headers))
    for row in cells:
        out(line(row))


def parse_time(value: str | None) -> dt.datetime | None:
    """An API timestamp (ISO 8601, ``Z`` or an offset) as an aware datetime; None stays None."""
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)  # Python 3.11 reads "Z"
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def when(value: str | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` UTC, or ``-``."""
    parsed = parse_time(value)
    return parsed.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if parsed else "-"


def duration(seconds: float) -> str:
    """A short human duration: ``45s``, ``12m``, ``3h``, ``2d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def age(value: str | None, now: dt.datetime | None = None) -> str:
    """How long ago ``value`` (an API timestamp) was."""
    parsed = parse_time(value)
    if parsed is None:
        return "-"
    return duration(((now or dt.datetime.now(dt.timezone.utc)) - parsed).total_seconds())


def usd(value) -> str:
    """An API money string (``"12.35"``) as ``$12.35``; None as ``-``."""
    return "-" if value is None else f"${value}"


def gpu_hours(value) -> str:
    """GPU-hours with 2 decimals."""
    return "-" if value is None else f"{float(value):,.2f}"


def resources_line(job: dict) -> str:
    """``2 node(s) x 8 H100-80GB = 16 GPUs``; a CPU-only job (0 GPUs per node) by its CPU and memory per node."""
    if job.get("gpus_per_node") == 0:
        res = ((job.get("spec") or {}).get("resources")) or {}
        memory = f", {res['memory_gib']:g} GiB" if isinstance(res.get("memory_gib"), (int, float)) else ""
        cpu = f"{res['cpu']:g}" if isinstance(res.get("cpu"), (int, float)) else "?"
        return f"{job.get('nodes')} node(s) x {cpu} CPU cores{memory} (CPU-only, no GPUs)"
    return (f"{job.get('nodes')} node(s) x {job.get('gpus_per_node')} {job.get('accelerator')} "
            f"= {job.get('total_gpus')} GPUs")


def state_line(job: dict) -> str:
    """``QUEUED``, with the state's reason and, for a waiting job, why it waits and its place in the queue."""
    text = job["state"]
    reason = job.get("state_reason")
    info = job.get("queue_info") or {}
    if job["state"] in ("QUEUED", "RECOVERING") and info.get("message"):
        text += f": waiting for {info.get('reason', '?')}: {info['message']}"
    elif reason:
        text += f": {reason}"
    position = job.get("position")
    if position:
        text += f" (position {position.get('team', '?')} in team, {position.get('overall', '?')} overall)"
    return text


# --- commands ---------------------------------------------------------------------------------------------------------

def read_document(path: str) -> tuple[bytes, str]:
    """The bytes of the job document at ``path`` (``-``: stdin) and its media type: JSON for ``.json`` or a body
    that parses as JSON, else YAML."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CliError(EXIT_BAD_INPUT, f"error: cannot read {path}: {exc.strerror or exc}") from None
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return raw, "application/json"
    if suffix in (".yaml", ".yml"):
        return raw, "application/yaml"
    try:
        json.loads(raw)
    except ValueError:
        return raw, "application/yaml"
    return raw, "application/json"


def override_document(raw: bytes, media_type: str, path: str, overrides: dict) -> bytes:
    """``raw`` with the top-level fields in ``overrides`` replaced (``--team``, ``--name``), in the same format."""
    import yaml  # PyYAML, a runtime dependency (requirements/runtime.in); only needed to rewrite a document

    try:
        document = json.loads(raw) if media_type == "application/json" else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        kind = "JSON" if media_type == "application/json" else "YAML"
        raise CliError(EXIT_BAD_INPUT, f"error: {path} is not valid {kind}: {exc}") from None
    if not isinstance(document, dict):
        raise CliError(EXIT_BAD_INPUT, f"error: {path} must hold a mapping with team, name, kind and spec")
    document.update(overrides)
    if media_type == "application/json":
        return json.dumps(document).encode()
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()


def cmd_submit(client: Client, args) -> int:
    """POST the job document; print the job's id and state, and with ``--wait`` follow it to a final state."""
    raw, media_type = read_document(args.file)
    overrides = {key: value for key, value in (("team", args.team), ("name", args.name)) if value is not None}
    if overrides:
        raw = override_document(raw, media_type, args.file, overrides)
    job = client.json("POST", "jobs/", data=raw, content_type=media_type)
    if args.json and not args.wait:
        print_json(job)
        return EXIT_OK
    say = err if args.json else out
    say(f"job {job['id']} submitted: {job['name']} (team {job['team']}), {state_line(job)}")
    if not args.wait:
        return EXIT_OK
    job = follow_job(client, job, args.interval, say)
    if args.json:
        print_json(job)
    return EXIT_OK if job["state"] == "SUCCEEDED" else EXIT_JOB_NOT_SUCCEEDED


def follow_job(client: Client, job: dict, interval: float, say) -> dict:
    """Poll the job every ``interval`` seconds, reporting each change of state or queue reason; return it once final."""
    seen = state_line(job)
    try:
        while job["state"] not in FINAL_STATES:
            time.sleep(interval)
            job = client.get(f"jobs/{job['id']}/")
            line = state_line(job)
            if line != seen:
                say(f"{dt.datetime.now(dt.timezone.utc):%H:%M:%S}  job {job['id']}: {line}")
                seen = line
    except KeyboardInterrupt:
        raise CliError(EXIT_INTERRUPTED, f"stopped following job {job['id']}; it keeps running "
                                         f"(cancel it with: cpctl cancel {job['id']})") from None
    cost = f", cost {usd(job.get('accrued_cost_usd'))}" if job.get("accrued_cost_usd") is not None else ""
    say(f"job {job['id']} ended {job['state']}{cost}")
    return job


def job_row(job: dict, now: dt.datetime) -> list:
    """A row of the ``jobs`` table."""
    return [job["id"], job["team"], job["name"], job["state"], job.get("total_gpus"), job.get("accelerator"),
            usd(job.get("accrued_cost_usd")), age(job.get("created_at"), now)]


def cmd_jobs(client: Client, args) -> int:
    """The job list (newest first), filtered by team and state."""
    params: dict = {}
    if args.team:
        params["team"] = args.team
    states = [s.strip().upper() for value in args.state or [] for s in value.split(",") if s.strip()]
    if states:
        params["state"] = states
    page = client.get_pages("jobs/", params, limit=args.limit)
    if args.json:
        print_json(page)
        return EXIT_OK
    jobs = page["results"]
    if not jobs:
        err("no jobs")
        return EXIT_OK
    now = dt.datetime.now(dt.timezone.utc)
    table(["ID", "TEAM", "NAME", "STATE", "GPUS", "ACCELERATOR", "COST", "AGE"],
          [job_row(job, now) for job in jobs], right=("ID", "GPUS", "COST", "AGE"))
    if page["count"] > len(jobs):
        err(f"({len(jobs)} of {page['count']} jobs; --limit shows more)")
    return EXIT_OK


def cmd_job(client: Client, args) -> int:
    """One job's details: state and why it waits, resources, attempt, cost, times."""
    job = client.get(f"jobs/{args.id}/")
    if args.json:
        print_json(job)
        return EXIT_OK
    fields: list[tuple[str, str]] = [
        ("team", f"{job['team']} (submitted by {job.get('submitter')})"),
        ("kind", job.get("kind")),
        ("state", job["state"] + (f": {job['state_reason']}" if job.get("state_reason") else "")),
    ]
    info = job.get("queue_info") or {}
    if job["state"] in ("QUEUED", "RECOVERING") and (info.get("reason") or info.get("message")):
        fields.append(("waiting for", f"{info.get('reason', '?')}: {info.get('message', '')}".rstrip(": ")))
    position = job.get("position")
    if position:
        fields.append(("queue position", (f"{position.get('team', '?')} in team {job['team']}, "
                                          f"{position.get('overall', '?')} overall")))
    fields += [
        ("resources", resources_line(job)),
        ("priority", f"{job.get('priority_class') or '-'} ({job.get('priority')})"
                     + (", preemptible" if job.get("preemptible") else "")),
        ("limits", (f"max runtime {duration(job.get('max_runtime_seconds') or 0)}, "
                    f"max retries {job.get('max_retries')}")),
    ]
    attempt = job.get("current_attempt")
    if attempt:
        text = f"#{attempt['number']} on {attempt.get('cluster')} ({attempt.get('node_pool')})"
        if attempt.get("started_at"):
            text += f", started {when(attempt['started_at'])}"
        if attempt.get("ended_at"):
            text += f", ended {when(attempt['ended_at'])}"
        if attempt.get("end_reason"):
            text += f": {attempt['end_reason']}"
        fields.append(("attempt", text))
    if job.get("kind") == "inference":
        source = (job.get("spec") or {}).get("checkpoint_from")
        if source:
            fields.append(("serves", f"the checkpoint of job {source}"))
        fields.append(("endpoint", job.get("endpoint") or "none (it serves only while RUNNING)"))
    estimate = job.get("estimated_cost_usd")
    fields.append(("cost", f"{usd(job.get('accrued_cost_usd'))} accrued, " + (
        "estimated once placed" if estimate is None else f"{usd(estimate)} estimated (worst case)")))
    if (job.get("efficiency") or {}).get("attempts"):
        fields += efficiency_fields(job["efficiency"])
    for name in ("created", "admitted", "started", "ended"):
        value = job.get(f"{name}_at")
        if value:
            fields.append((name, f"{when(value)} UTC ({age(value)} ago)"))
    out(f"job {job['id']}  {job['name']}")
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        out(f"  {name.ljust(width)}  {value}")
    return EXIT_OK


def mfu_text(mfu, reason: str) -> str:
    """``"41.20 %"``, or ``"n/a (why)"`` when the API gives no MFU."""
    return "n/a" + (f" ({reason})" if reason else "") if mfu is None else f"{mfu:.2f} %"


def efficiency_fields(efficiency: dict) -> list[tuple[str, str]]:
    """The job's ``efficiency`` (API) as ``cpctl job`` lines: throughput, MFU, tokens and USD per million."""
    tokens_per_s = efficiency.get("tokens_per_s")
    fields = [("throughput", "not reported" if tokens_per_s is None else f"{tokens_per_s:,.1f} tokens/s"),
              ("MFU", mfu_text(efficiency.get("mfu_percent"), efficiency.get("mfu_reason") or ""))]
    if efficiency.get("tokens") is not None:
        per_million = efficiency.get("usd_per_million_tokens")
        fields.append(("tokens", f"{efficiency['tokens']:,}" + (
            "" if per_million is None else f", ${Decimal(per_million):.4f} per million")))
    return fields


def cmd_efficiency(client: Client, args) -> int:
    """A job's training efficiency per attempt: last and mean throughput, loss, MFU, tokens."""
    body = client.get(f"jobs/{args.id}/efficiency/")
    if args.json:
        print_json(body)
        return EXIT_OK
    rows = []
    for a in body.get("attempts") or []:
        last, mean = a.get("last") or {}, a.get("mean") or {}
        rows.append([a["attempt"], "-" if last.get("step") is None else last["step"],
                     "-" if last.get("tokens_per_s") is None else f"{last['tokens_per_s']:,.1f}",
                     "-" if a.get("tokens_per_s") is None else f"{a['tokens_per_s']:,.1f}",
                     "-" if mean.get("loss") is None else f"{mean['loss']:.4f}",
                     "n/a" if a.get("mfu_percent") is None else f"{a['mfu_percent']:.2f} %",
                     "-" if a.get("tokens") is None else f"{a['tokens']:,}"])
    table(["ATTEMPT", "STEP", "LAST TOKENS/S", "RUN TOKENS/S", "MEAN LOSS", "MFU", "TOKENS"], rows,
          right=("STEP", "LAST TOKENS/S", "RUN TOKENS/S", "MEAN LOSS", "MFU", "TOKENS"))
    for name, value in efficiency_fields(body):
        out(f"{name}: {value}")
    return EXIT_OK


def cmd_events(client: Client, args) -> int:
    """The job's timeline, oldest first."""
    page = client.get_pages(f"jobs/{args.id}/events/")
    if args.json:
        print_json(page)
        return EXIT_OK
    rows = []
    for event in page["results"]:
        before, after = event.get("from_state") or "", event.get("to_state") or ""
        change = f"{before} -> {after}" if before and after and before != after else after
        rows.append([when(event["created_at"]), event["kind"], change, event.get("attempt"), event.get("actor"),
                     event.get("reason")])
    if not rows:
        err("no events")
        return EXIT_OK
    table(["TIME (UTC)", "KIND", "STATE", "ATTEMPT", "ACTOR", "REASON"], rows)
    return EXIT_OK


def cmd_logs(client: Client, args) -> int:
    """The tail of one node's log of the job's current attempt; ``--follow`` streams new lines as they come."""
    params = {"node": args.node, "tail": args.tail}
    if not args.follow:
        body = client.get(f"jobs/{args.id}/logs/", params)
        if args.json:
            print_json(body)
        elif body.get("attempt") is None:
            err(f"job {args.id} has no attempt yet: no logs")
        else:
            text = body.get("text") or ""
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
            if not text:
                err(empty_log_hint(client, args.id, args.node, body.get("attempt")))
        return EXIT_OK
    if args.json:
        raise CliError(EXIT_BAD_INPUT, "error: --json cannot be combined with --follow (the stream is plain text)")
    response = client.request("GET", f"jobs/{args.id}/logs/", params={**params, "follow": 1}, stream=True,
                              read_timeout=None)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        with response:
            # read1: whatever has arrived, at once. iter_content(None) waits for the end of a stream that is
            # not chunked (a server answering "Connection: close"), which a followed log may never reach.
            while chunk := response.raw.read1(65536):
                sys.stdout.write(decoder.decode(chunk))
                sys.stdout.flush()
            sys.stdout.write(decoder.decode(b"", final=True))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except requests.exceptions.RequestException:
        raise CliError(EXIT_UNREACHABLE, f"error: the log stream from {redact(client.base_url)} broke off") from None
    return EXIT_OK


def empty_log_hint(client: Client, job_id: int, node: int, attempt: int) -> str:
    """What to tell a user whose node log is empty: that the node printed nothing (yet), and which nodes there are
    (in distributed training often only rank 0 logs)."""
    try:
        nodes = client.get(f"jobs/{job_id}/").get("nodes") or 1
    except CliError:
        nodes = None
    others = ""
    if nodes and nodes > 1:
        others = (f"; the job has {nodes} nodes (0 to {nodes - 1}) and often only rank 0 prints: "
                  f"try --node {0 if node else 1}")
    return f"(node {node} of attempt {attempt} has printed nothing yet{others})"


def cmd_cancel(client: Client, args) -> int:
    """Cancel the job: CANCELLED at once when nothing runs, else CANCELLING until the cluster confirms."""
    job = client.json("POST", f"jobs/{args.id}/cancel/")
    if args.json:
        print_json(job)
    elif job["state"] == "CANCELLING":
        out(f"job {job['id']}: CANCELLING (its cluster is deleting it; `job {job['id']}` shows when it is CANCELLED)")
    else:
        out(f"job {job['id']}: {job['state']}")
    return EXIT_OK


def cmd_nodes(client: Client, args) -> int:
    """GPU nodes of every cluster with their health, whether admission may use them, and the evidence."""
    params = {k: v for k, v in (("cluster", args.cluster), ("health", args.health)) if v}
    page = client.get_pages("nodes/", params or None)
    if args.json:
        print_json(page)
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


def cmd_node_action(client: Client, args) -> int:
    """Staff: cordon, uncordon or clear the health of node ``args.id``; prints its health afterwards."""
    body = {"note": args.note} if getattr(args, "note", None) else {}
    node = client.json("POST", f"nodes/{args.id}/{args.node_action}/", data=json.dumps(body),
                       content_type="application/json")
    if args.json:
        print_json(node)
    else:
        out(f"node {node['cluster']}/{node['name']}: {node['health']}, "
            + ("cordoned" if node.get("cordoned") else "not cordoned")
            + (", takes work" if node.get("takes_work") else ", takes no work"))
    return EXIT_OK


def _quota_row(q: dict) -> list:
    """A quota as a table row: GPUs, or vCPUs for a CPU quota (accelerator ``CPU``), with the unit. LIMIT is
    nominal + borrowing limit; REACHABLE what the team can actually hold (at most nominal + what its cohort can
    lend it), the number admission, the preview and a waiting job's reason use."""
    unit = "vcpus" if q["accelerator"] == "CPU" else "gpus"
    return [q["team"], q["accelerator"], q.get("cluster") or "all", q.get(f"nominal_{unit}"),
            q.get(f"borrowing_limit_{unit}"), q.get(f"limit_{unit}"), q.get(f"reachable_{unit}"),
            q.get(f"max_{unit}_per_job") or "-", "vCPUs" if unit == "vcpus" else "GPUs"]


def cmd_quotas(client: Client, args) -> int:
    """GPU quotas of the user's teams, and CPU quotas (accelerator CPU) in vCPUs."""
    page = client.get_pages("quotas/", {"team": args.team} if args.team else None)
    if args.json:
        print_json(page)
        return EXIT_OK
    rows = [_quota_row(q) for q in page["results"]]
    if not rows:
        err("no quotas")
        return EXIT_OK
    table(["TEAM", "ACCELERATOR", "CLUSTER", "NOMINAL", "BORROWING", "LIMIT", "REACHABLE", "MAX/JOB", "UNIT"], rows,
          right=("NOMINAL", "BORROWING", "LIMIT", "REACHABLE", "MAX/JOB"))
    return EXIT_OK


def cmd_clusters(client: Client, args) -> int:
    """Every cluster: where it is, its health, since when (UTC) and why it is not healthy, last contact, GPUs."""
    page = client.get_pages("clusters/")
    if args.json:
        print_json(page)
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


def cmd_budgets(client: Client, args) -> int:
    """Each budget's current period (``budget-status/``): amount, spent, committed, remaining, forecast."""
    statuses = client.get("budget-status/")
    if args.team:
        statuses = [s for s in statuses if s.get("team") == args.team]
    if args.json:
        print_json(statuses)
        return EXIT_OK
    if not statuses:
        err("no budgets in force")
        return EXIT_OK
    rows = [[s["team"], s["period"], when(s.get("period_end"))[:10], usd(s["amount_usd"]), usd(s["spent_usd"]),
             usd(s["committed_usd"]), usd(s["remaining_usd"]), usd(s["forecast_usd"]), s["action"]]
            for s in statuses]
    table(["TEAM", "PERIOD", "ENDS", "AMOUNT", "SPENT", "COMMITTED", "REMAINING", "FORECAST", "AT 100%"], rows,
          right=("AMOUNT", "SPENT", "COMMITTED", "REMAINING", "FORECAST"))
    return EXIT_OK


def as_api_time(value: str | None) -> str | None:
    """A ``--start``/``--end`` value for the API: a bare date ``YYYY-MM-DD`` means its midnight UTC; anything
    else is sent as given (the API wants ISO 8601 with an offset and says so otherwise)."""
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value).isoformat() + "T00:00:00Z" if len(value) == 10 else value
    except ValueError:
        return value


def cmd_costs(client: Client, args) -> int:
    """GPU-hours and USD from the cost ledger, grouped by team, cluster, accelerator, job or UTC day."""
    report = client.get("costs/", cost_query(args))
    if args.json:
        print_json(report)
        return EXIT_OK
    keys = ["job", "job_name"] if args.group_by == "job" else [args.group_by]
    headers = [k.replace("_", " ").upper() for k in keys] + ["GPU-HOURS", "COST"]
    rows = [[row.get(k) for k in keys] + [gpu_hours(row.get("gpu_hours")), usd(row.get("cost_usd"))]
            for row in report["results"]]
    total = report.get("total") or {}
    rows.append(["TOTAL"] + [""] * (len(keys) - 1) + [gpu_hours(total.get("gpu_hours")), usd(total.get("cost_usd"))])
    out(f"costs by {report['group_by']}, {window(report)} (UTC)")
    table(headers, rows, right=("JOB", "GPU-HOURS", "COST"))
    return EXIT_OK


def cost_query(args) -> dict:
    """The ``group_by``/``start``/``end``/``team`` query of ``costs`` and ``utilization`` from the options."""
    params = {"group_by": args.group_by}
    for name in ("start", "end"):
        value = as_api_time(getattr(args, name))
        if value is not None:
            params[name] = value
    if args.team:
        params["team"] = args.team
    return params


def window(report: dict) -> str:
    """``<start> to <end>`` of a costs or utilization answer (open ends in words)."""
    return (f"{when(report.get('start')) if report.get('start') else 'the beginning'} to "
            f"{when(report.get('end')) if report.get('end') else 'now'}")


def percent(value, digits: int = 1) -> str:
    """A percentage for a table; ``n/a`` for null (no samples: never shown as 0 %)."""
    return "n/a" if value is None else f"{float(value):.{digits}f}%"


def cmd_utilization(client: Client, args) -> int:
    """GPU utilization from the Prometheus rollups: average, coverage, idle GPU-hours and their USD, grouped."""
    report = client.get("utilization/", cost_query(args))
    if args.json:
        print_json(report)
        return EXIT_OK
    keys = ["job", "job_name"] if args.group_by == "job" else [args.group_by]
    headers = [k.replace("_", " ").upper() for k in keys] + ["GPU-HOURS", "AVG UTIL", "COVERAGE", "IDLE GPU-H",
                                                              "IDLE COST"]

    def cells(row: dict) -> list:
        coverage = row.get("coverage")
        return [gpu_hours(row.get("gpu_hours")), percent(row.get("avg_gpu_util_percent")),
                percent(None if coverage is None else coverage * 100, 0), gpu_hours(row.get("idle_gpu_hours")),
                usd(row.get("idle_cost_usd"))]

    rows = [[row.get(k) for k in keys] + cells(row) for row in report["results"]]
    rows.append(["TOTAL"] + [""] * (len(keys) - 1) + cells(report.get("total") or {}))
    out(f"GPU utilization by {report['group_by']}, {window(report)} (UTC); n/a: no GPU samples")
    table(headers, rows, right=("JOB", "GPU-HOURS", "AVG UTIL", "COVERAGE", "IDLE GPU-H", "IDLE COST"))
    return EXIT_OK


def cmd_reports(client: Client, args) -> int:
    """Stored reports, newest first: id, scope, kind, period, GPU-hours, cost, average utilization."""
    params = {"ordering": "-period_end"}
    if args.kind:
        params["kind"] = args.kind
    page = client.get_pages("reports/", params, limit=args.limit)
    reports = [r for r in page["results"] if not args.team or (r.get("team") or "platform") == args.team]
    if args.json:
        print_json({**page, "results": reports})
        return EXIT_OK
    if not reports:
        err("no reports (daily ones are made at 06:00 UTC, weekly ones on Mondays)")
        return EXIT_OK
    rows = []
    for r in reports:
        data = r.get("data") or {}
        totals, util = data.get("totals") or {}, data.get("utilization") or {}
        rows.append([r["id"], r.get("team") or "platform", r["kind"], when(r["period_start"]),
                     when(r["period_end"]), gpu_hours(totals.get("gpu_hours")), usd(totals.get("cost_usd")),
                     percent(util.get("avg_gpu_util_percent"))])
    table(["ID", "SCOPE", "KIND", "FROM (UTC)", "TO (UTC)", "GPU-HOURS", "COST", "AVG UTIL"], rows,
          right=("ID", "GPU-HOURS", "COST", "AVG UTIL"))
    if page["count"] > len(page["results"]):
        err(f"({len(page['results'])} of {page['count']} reports; --limit shows more)")
    return EXIT_OK


def cmd_report(client: Client, args) -> int:
    """One report: its totals, change on the period before, utilization, top jobs, quota use and budgets; or its
    CSV (``--csv``, as the API gives it)."""
    if args.csv:
        response = client.request("GET", f"reports/{args.id}/csv/")
        text = response.text
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return EXIT_OK
    report = client.get(f"reports/{args.id}/")
    if args.json:
        print_json(report)
        return EXIT_OK
    data = report.get("data") or {}
    totals, util, previous = data.get("totals") or {}, data.get("utilization") or {}, data.get("previous") or {}
    out(f"report {report['id']}  {report['kind']} for {report.get('team') or 'the platform'}, "
        f"{when(report['period_start'])} to {when(report['period_end'])} UTC")
    change = previous.get("cost_change_percent")
    fields = [
        ("GPU-hours", gpu_hours(totals.get("gpu_hours"))),
        ("cost", usd(totals.get("cost_usd")) + ("" if change is None else f" ({change:+.1f}% on the period before)")),
        ("utilization", f"{percent(util.get('avg_gpu_util_percent'))} average, "
                        f"{percent(util.get('coverage_percent'), 0)} of samples"
                        + (f"; idle {gpu_hours(util.get('idle_gpu_hours'))} GPU-h = {usd(util.get('idle_cost_usd'))}"
                           if util.get("idle_gpu_hours") is not None else "")),
    ]
    if util.get("note"):
        fields.append(("note", util["note"]))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        out(f"  {name.ljust(width)}  {value}")
    sections = [
        ("Top jobs", ["JOB", "NAME", "TEAM", "GPU-HOURS", "COST"], [
            [j.get("job"), j.get("job_name"), j.get("team"), gpu_hours(j.get("gpu_hours")), usd(j.get("cost_usd"))]
            for j in data.get("top_jobs") or []]),
        ("Quota use", ["ACCELERATOR", "NOMINAL", "GPU-HOURS", "AVG GPUS", "OF NOMINAL"], [
            [q.get("accelerator"), q.get("nominal_gpus"), gpu_hours(q.get("gpu_hours")),
             f"{float(q.get('avg_gpus_in_use') or 0):.2f}", percent(q.get("percent_of_nominal"))]
            for q in data.get("quota_use") or []]),
        ("Budgets", ["TEAM", "PERIOD", "AMOUNT", "SPENT", "REMAINING", "SPENT %"], [
            [b.get("team"), b.get("period"), usd(b.get("amount_usd")), usd(b.get("spent_usd")),
             usd(b.get("remaining_usd")), percent(b.get("spent_percent"))] for b in data.get("budgets") or []]),
    ]
    for title, headers, rows in sections:
        if rows:
            out()
            out(title)
            table(headers, rows, right=tuple(h for h in headers if h not in ("NAME", "TEAM", "ACCELERATOR", "PERIOD")))
    return EXIT_OK


# --- command line -----------------------------------------------------------------------------------------------------

def positive_float(value: str) -> float:
    """argparse type: a finite number above zero (seconds: ``inf`` would overflow the socket timeout)."""
    number = float(value)
    if not number > 0 or not math.isfinite(number) or number > 1e6:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1000000, not {value}")
    return number


def check_connection_settings(url: str, token: str | None) -> str | None:
    """Why ``url`` or ``token`` cannot be used (a one-line message), or None when both can."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:  # not echoed: a URL that does not parse cannot be cleaned of a password either
        return f"error: bad control plane URL (CONTROLPLANE_URL or --url): {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"error: bad control plane URL {redact(url)}: expected http(s)://host[:port]"
    if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
        return "error: the API token must be printable ASCII without spaces (as issued); check CONTROLPLANE_TOKEN"
    return None


def positive_int(value: str) -> int:
    """argparse type: an integer above zero."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--url``, ``--token`` and ``--json`` are accepted before or after the command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS,
                        help=f"the control plane's URL (env CONTROLPLANE_URL, default {DEFAULT_URL})")
    common.add_argument("--token", default=argparse.SUPPRESS,
                        help="API token (env CONTROLPLANE_TOKEN; the variable keeps it out of ps)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the API's JSON instead of a table")
    common.add_argument("--timeout", type=positive_float, default=argparse.SUPPRESS,
                        help="seconds to wait for each answer (default 30)")

    parser = argparse.ArgumentParser(
        prog="cpctl", parents=[common],
        description="Submit and follow GPU jobs, read quotas, budgets, costs, utilization and reports, through the "
                    "control plane's API.",
        epilog="Exit codes: 0 ok, 1 job did not succeed (--wait), 2 bad input (400), 3 unauthorized (401), "
               "4 forbidden (403), 5 not found (404), 6 conflict (409), 7 unreachable, 8 unexpected answer.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, handler, help_text):
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    sub = command("submit", cmd_submit, "submit a job from a YAML or JSON document (- reads stdin)")
    sub.add_argument("file", metavar="FILE", help="job document, as in examples/jobs/*.yaml")
    sub.add_argument("--team", help="submit for this team (replaces the document's team)")
    sub.add_argument("--name", help="job name (replaces the document's name)")
    sub.add_argument("--wait", action="store_true", help="follow the job to a final state; exit 0 only on SUCCEEDED")
    sub.add_argument("--interval", type=positive_float, default=2.0, help="seconds between polls with --wait")

    sub = command("jobs", cmd_jobs, "list jobs, newest first")
    sub.add_argument("--team", help="team slug")
    sub.add_argument("--state", action="append", help="state (repeat, or comma-separated: QUEUED,RUNNING)")
    sub.add_argument("--limit", type=positive_int, default=50, help="at most this many jobs (default 50)")

    for name, handler, help_text in (("job", cmd_job, "show a job: state, why it waits, attempt, cost"),
                                     ("events", cmd_events, "show a job's timeline"),
                                     ("efficiency", cmd_efficiency,
                                      "show a job's training throughput, MFU and cost per million tokens"),
                                     ("cancel", cmd_cancel, "cancel a job")):
        command(name, handler, help_text).add_argument("id", metavar="ID", type=int, help="job id")

    sub = command("logs", cmd_logs, "show the log of a job's current attempt")
    sub.add_argument("id", metavar="ID", type=int, help="job id")
    sub.add_argument("--node", type=int, default=0, help="node index, 0-based (default 0)")
    sub.add_argument("--tail", type=positive_int, default=200, help="trailing lines (default 200)")
    sub.add_argument("-f", "--follow", action="store_true", help="stream new lines until the attempt ends")

    sub = command("quotas", cmd_quotas, "list GPU quotas and CPU quotas (vCPUs)")
    sub.add_argument("--team", help="team slug")
    command("clusters", cmd_clusters, "list clusters: health, since when and why, last contact, GPUs")
    sub = command("budgets", cmd_budgets, "budgets' current period: spent, committed, remaining, forecast")
    sub.add_argument("--team", help="team slug")

    for name, handler, help_text in (
            ("costs", cmd_costs, "cost from the ledger, grouped"),
            ("utilization", cmd_utilization, "GPU utilization from Prometheus: average, coverage, idle GPU-hours")):
        sub = command(name, handler, help_text)
        sub.add_argument("--group-by", choices=GROUP_BY_CHOICES, default="team", help="default team")
        sub.add_argument("--start", help="ISO 8601 datetime with offset, or a date (midnight UTC); inclusive")
        sub.add_argument("--end", help="ISO 8601 datetime with offset, or a date (midnight UTC); exclusive")
        sub.add_argument("--team", help="team slug")

    sub = command("reports", cmd_reports, "list stored utilization and cost reports, newest first")
    sub.add_argument("--team", help="team slug (platform: the platform-wide reports)")
    sub.add_argument("--kind", choices=("daily", "weekly", "custom"), help="only reports of this kind")
    sub.add_argument("--limit", type=positive_int, default=50, help="at most this many reports (default 50)")
    sub = command("nodes", cmd_nodes, "list GPU nodes with their health and its evidence")
    sub.add_argument("--cluster", help="cluster name")
    sub.add_argument("--health", choices=("healthy", "suspect", "unhealthy"), help="only nodes of this health")
    for name, action, help_text in (("cordon", "cordon", "staff: keep admission off a node (Kubernetes untouched)"),
                                    ("uncordon", "uncordon", "staff: let admission use a cordoned node again"),
                                    ("clear-health", "clear", "staff: clear a node's health evidence")):
        sub = command(name, cmd_node_action, help_text)
        sub.set_defaults(node_action=action)
        sub.add_argument("id", metavar="ID", type=int, help="node id (from `nodes`)")
        if action == "cordon":
            sub.add_argument("--note", help="why, shown next to the node")
    sub = command("report", cmd_report, "show one report's figures, or its CSV")
    sub.add_argument("id", metavar="ID", type=int, help="report id")
    sub.add_argument("--csv", action="store_true", help="print the report's CSV (section,item,metric,value)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring). Errors go to stderr."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    args.json = getattr(args, "json", False)
    url = getattr(args, "url", None) or os.environ.get("CONTROLPLANE_URL") or DEFAULT_URL
    token = getattr(args, "token", None) or os.environ.get("CONTROLPLANE_TOKEN") or None
    problem = check_connection_settings(url, token)
    if problem is not None:
        err(problem)
        return EXIT_BAD_INPUT
    client = Client(url, token, timeout=getattr(args, "timeout", 30.0))
    try:
        return args.handler(client, args)
    except CliError as exc:
        for line in exc.lines:
            err(line)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `cpctl jobs | head`
        return EXIT_OK
    finally:
        client.session.close()


if __name__ == "__main__":
    sys.exit(main())
