"""Job commands: ``submit``, ``resubmit``, ``jobs``, ``job``, ``events``, ``efficiency``, ``logs``, ``cancel``,
``rollout``."""

from __future__ import annotations

import codecs
import datetime as dt
import json
import sys
import time
from pathlib import Path

import click
import requests

from cpctl.client import Client, redact
from cpctl.commands.arrays import parsed_document, submit_array
from cpctl.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_JOB_NOT_SUCCEEDED, EXIT_OK, EXIT_UNREACHABLE, CliError
from cpctl.options import POSITIVE_INT, Api, PositiveFloat, api_command
from cpctl.output import (
    age,
    duration,
    err,
    fields,
    gpu_hours,
    money,
    out,
    percent,
    print_json,
    shown_amount,
    table,
    usd,
    when,
)

FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "REJECTED")


def job_id(fn):
    """The ``ID`` argument: a job id."""
    return click.argument("id", metavar="ID", type=int)(fn)


# --- submit -----------------------------------------------------------------------------------------------------------

def read_document(path: str) -> tuple[bytes, str]:
    """The bytes of the job document at ``path`` (``-``: stdin) and its media type: JSON for ``.json`` or a body
    that parses as JSON, else YAML. CliError (exit 2) when it cannot be read."""
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
    """``raw`` with the top-level fields in ``overrides`` replaced (``--team``, ``--name``), in the same format.
    CliError (exit 2) when it does not parse or is not a mapping."""
    import yaml  # PyYAML, a runtime dependency (requirements/runtime.in); only needed to rewrite a document

    class UniqueKeyLoader(yaml.SafeLoader):
        """PyYAML's safe loader refusing a key named twice in one mapping, as the API does: rewritten, the document
        would otherwise lose the first value before the API could refuse it."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.value in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f'duplicate key "{key_node.value}": a mapping names each key once',
                            key_node.start_mark)
                    seen.add(key_node.value)
            return super().construct_mapping(node, deep)

    try:
        document = json.loads(raw) if media_type == "application/json" else yaml.load(raw, Loader=UniqueKeyLoader)  # noqa: S506
    except (ValueError, yaml.YAMLError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        kind = "JSON" if media_type == "application/json" else "YAML"
        raise CliError(EXIT_BAD_INPUT, f"error: {path} is not valid {kind}: {exc}") from None
    if not isinstance(document, dict):
        raise CliError(EXIT_BAD_INPUT, f"error: {path} must hold a mapping with team, name, kind and spec")
    document.update(overrides)
    if media_type == "application/json":
        return json.dumps(document).encode()
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()


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


@api_command("submit", "submit a job from a YAML or JSON document (- reads stdin)")
@click.argument("file", metavar="FILE")
@click.option("--team", help="submit for this team (replaces the document's team)")
@click.option("--name", help="job name (replaces the document's name)")
@click.option("--wait", is_flag=True, help="follow the job to a final state; exit 0 only on SUCCEEDED")
@click.option("--interval", type=PositiveFloat(), default=2.0, show_default=True,
              help="seconds between polls with --wait")
@click.option("--dry-run", is_flag=True, help="submit nothing: show where the job would run, every candidate node "
              "pool with its price, the estimate, quota and budget; exit 2 when submission would refuse it")
def submit(api: Api, file: str, team: str | None, name: str | None, wait: bool, interval: float,
           dry_run: bool) -> int:
    """POST the job document; print the job's id and state, and with ``--wait`` follow it to a final state. With
    ``--dry-run``, POST it to ``jobs/preview/`` instead and print the answer (exit 2 when it would be refused). A
    document with ``array:`` (count or grid, parallelism) is a job array, POSTed to ``arrays/``
    (``cpctl.commands.arrays.submit_array``)."""
    if dry_run and wait:
        raise click.UsageError("--dry-run submits nothing, so there is nothing to --wait for")
    raw, media_type = read_document(file)
    overrides = {key: value for key, value in (("team", team), ("name", name)) if value is not None}
    if overrides:
        raw = override_document(raw, media_type, file, overrides)
    document = parsed_document(raw, media_type)
    if document is not None and "array" in document:  # a job array or parameter sweep: one request for all
        return submit_array(api, raw, media_type, document, wait, interval, dry_run, show_preview)
    if dry_run:
        preview = api.client.json("POST", "jobs/preview/", data=raw, content_type=media_type)
        if api.json:
            print_json(preview)
        else:
            show_preview(preview)
        return EXIT_BAD_INPUT if preview["outcome"] == "refused" else EXIT_OK
    job = api.client.json("POST", "jobs/", data=raw, content_type=media_type)
    return report_submitted(api, job, "submitted", wait, interval)


def report_submitted(api: Api, job: dict, how: str, wait: bool, interval: float) -> int:
    """Print the new ``job`` (the API's answer; ``how``: the words after its id, ``submitted``) and, with ``wait``,
    follow it to a final state every ``interval`` seconds. Returns the exit status: 0, or with ``wait``
    ``EXIT_JOB_NOT_SUCCEEDED`` unless it SUCCEEDED. CliError (``EXIT_INTERRUPTED``) on Ctrl-C while following."""
    if api.json and not wait:
        print_json(job)
        return EXIT_OK
    say = err if api.json else out
    try:  # from here on, Ctrl-C leaves a submitted job behind: say so
        say(f"job {job['id']} {how}: {job['name']} (team {job['team']}), {state_line(job)}")
        if not wait:
            return EXIT_OK
        job = follow_job(api.client, job, interval, say)
    except KeyboardInterrupt:
        raise CliError(EXIT_INTERRUPTED, f"stopped following job {job['id']}; it keeps running "
                                         f"(cancel it with: cpctl cancel {job['id']})") from None
    if api.json:
        print_json(job)
    return EXIT_OK if job["state"] == "SUCCEEDED" else EXIT_JOB_NOT_SUCCEEDED


def _verdict(verdict: dict | None) -> str:
    if verdict is None:
        return "unknown (no estimate)"
    return "allows it now" if verdict["ok"] else verdict["message"]


def _asks(preview: dict) -> str:
    """What a dry run's worst case counts: ``1 GPU``, ``8 GPUs``, a share ``0.25 of 1 GPU``, or a CPU-only job's
    ``2 vCPUs and 4 GiB``."""
    gpus = preview["total_gpus"]
    if gpus and gpus < 1:  # a share of one GPU, as the ledger bills it
        return f"{gpus:g} of 1 GPU"
    if gpus or not (preview.get("total_vcpus") or preview.get("total_memory_gib")):
        return f"{gpus} GPU{'' if gpus == 1 else 's'}"
    vcpus = preview["total_vcpus"]
    return f"{vcpus:g} vCPU{'' if vcpus == 1 else 's'} and {preview['total_memory_gib']:g} GiB"


#: What a dry run that has no room now waits for, by the ``short_of`` of its ``capacity``.
SHORT_OF = {"gpu": "free GPUs", "cpu": "free CPU (vCPU)", "memory": "free memory (GiB)",
            "nodes": "enough whole nodes"}

OUTCOMES = {"admit": "it would be admitted now", "wait": "it would be queued: it waits for what is named above",
            "refused": "submission would refuse it"}


def show_preview(preview: dict) -> None:
    """Print a dry run (``POST /jobs/preview/``) as the web form shows it: the placement, the estimate, quota and
    budget, then every candidate node pool with its price and why it was not chosen, then the outcome."""
    chosen = preview.get("placement")
    where = "no healthy cluster matches this accelerator and placement"
    if chosen is not None:
        short = preview.get("capacity")
        room = "room now" if preview["fits_now"] else (
            f"no room now: it would wait for {SHORT_OF.get(short['short_of'], short['short_of'])}. {short['message']}"
            if short else "no room now: it would wait for capacity")
        where = (f"{chosen['cluster']} pool {chosen['pool']} ({chosen['provider']}/{chosen['region']}, "
                 f"{chosen['capacity_type']}, {chosen['accelerator']}), {room}")
    budget = preview["refusal"]["message"] if preview.get("refusal") else _verdict(preview["budget"])
    fields([("Where", where),
            ("Estimate", f"{usd(preview['estimated_cost_usd'])} (worst case: {_asks(preview)} x "
                         + (f"{preview['max_runtime_seconds']} s)" if preview["max_runtime_seconds"] else
                            "30 days: no max runtime, it runs until cancelled)")),
            ("Quota", _verdict(preview["quota"])), ("Budget", budget),
            ("Outcome", OUTCOMES.get(preview["outcome"], preview["outcome"]))])
    if preview["candidates"]:
        out()
        table(["CLUSTER", "POOL", "ACCELERATOR", "NODES", "USD/HOUR", "ESTIMATE", "CHOSEN / WHY NOT"],
              [[c["cluster"], c["pool"], c["accelerator"], c["nodes"], usd(c["usd_per_hour"]) if c["usd_per_hour"] else "no price",
                usd(c["estimated_cost_usd"]), "chosen" if c["chosen"] else c["why_not"]]
               for c in preview["candidates"]], right=("NODES", "USD/HOUR", "ESTIMATE"))


@api_command("resubmit", "submit a job's submission again as a new job")
@job_id
@click.option("--name", help="name of the new job (default: the job's)")
@click.option("--wait", is_flag=True, help="follow the new job to a final state; exit 0 only on SUCCEEDED")
@click.option("--interval", type=PositiveFloat(), default=2.0, show_default=True,
              help="seconds between polls with --wait")
def resubmit(api: Api, id: int, name: str | None, wait: bool, interval: float) -> int:  # noqa: A002
    """POST ``jobs/ID/resubmit/``: the job's stored submission again, as a new job validated against today's rules;
    print the new job's id and state, and with ``--wait`` follow it to a final state."""
    job = api.client.json("POST", f"jobs/{id}/resubmit/", data=json.dumps({"name": name} if name else {}).encode(),
                          content_type="application/json")
    return report_submitted(api, job, f"submitted from job {id}", wait, interval)


def follow_job(client: Client, job: dict, interval: float, say) -> dict:
    """Poll the job every ``interval`` seconds, reporting each change of state or queue reason; return it once final."""
    seen = state_line(job)
    while job["state"] not in FINAL_STATES:
        time.sleep(interval)
        job = client.get(f"jobs/{job['id']}/")
        line = state_line(job)
        if line != seen:
            say(f"{dt.datetime.now(dt.timezone.utc):%H:%M:%S}  job {job['id']}: {line}")
            seen = line
    cost = f", cost {money(job, 'accrued_cost_usd')}" if "accrued_cost_usd" in job else ""
    say(f"job {job['id']} ended {job['state']}{cost}")
    return job


# --- reading jobs -----------------------------------------------------------------------------------------------------

@api_command("jobs", "list jobs, newest first")
@click.option("--team", help="team slug")
@click.option("--state", "states", multiple=True, help="state (repeat, or comma-separated: QUEUED,RUNNING)")
@click.option("--kind", type=click.Choice(["training", "inference", "multi-role", "any"]), default="any",
              show_default=True, help="job kind")
@click.option("--array", "array_id", type=POSITIVE_INT, help="only the elements of this array (its id)")
@click.option("--limit", type=POSITIVE_INT, default=50, help="at most this many jobs (default 50)")
def jobs(api: Api, team: str | None, states: tuple[str, ...], kind: str, array_id: int | None, limit: int) -> int:
    """The job list (newest first), filtered by team, state, kind and array: id, team, name, state, GPUs,
    accelerator, cost, age."""
    params: dict = {"team": team} if team else {}
    if array_id is not None:
        params["array"] = array_id
    if kind != "any":
        params["kind"] = kind
    wanted = [s.strip().upper() for value in states for s in value.split(",") if s.strip()]
    if wanted:
        params["state"] = wanted
    page = api.client.get_pages("jobs/", params, limit=limit)
    if api.shown_as_json(page):
        return EXIT_OK
    found = page["results"]
    if not found:
        err("no jobs")
        return EXIT_OK
    now = dt.datetime.now(dt.timezone.utc)
    table(["ID", "TEAM", "NAME", "STATE", "GPUS", "ACCELERATOR", "COST", "AGE"],
          [[job["id"], job["team"], job["name"], job["state"], gpus_held(job), job.get("accelerator"),
            money(job, "accrued_cost_usd"), age(job.get("created_at"), now)] for job in found],
          right=("ID", "GPUS", "COST", "AGE"))
    if page["count"] > len(found):
        err(f"({len(found)} of {page['count']} jobs; --limit shows more)")
    return EXIT_OK


def gpus_held(job: dict):
    """The GPUs a job (its API answer) holds, for the GPUS column: ``total_gpus``, or for a share of one GPU the
    share (``gpu_share_milli`` 250: ``0.25``; a MIG instance's share too)."""
    milli = job.get("gpu_share_milli")
    if isinstance(milli, int) and milli > 0:
        return f"{milli / 1000:g}"
    return job.get("total_gpus")


def resources_line(job: dict) -> str:
    """``2 node(s) x 8 H100-80GB = 16 GPUs``; a job on part of one GPU ``1 node x 0.25 of one H100-80GB`` or
    ``1 node x MIG 1g.10gb of one A100-80GB``; a CPU-only job (0 GPUs per node) by its CPU and memory per node."""
    if job.get("mig_profile"):
        return f"1 node x MIG {job['mig_profile']} of one {job.get('accelerator')}"
    if job.get("gpu_share_milli"):
        return f"1 node x {gpus_held(job)} of one {job.get('accelerator')}"
    if job.get("kind") == "multi-role":  # each role's pods, in name order (the platform's one order of roles)
        roles = (job.get("spec") or {}).get("roles")
        roles = roles if isinstance(roles, dict) else {}
        return "; ".join(f"{name}: {_pods_line((roles[name] or {}).get('resources') or {}, job.get('accelerator'))}"
                         for name in sorted(roles)) + f" = {_gpus(job.get('total_gpus'))}"
    if job.get("gpus_per_node") == 0:
        return _pods_line({**(((job.get("spec") or {}).get("resources")) or {}), "nodes": job.get("nodes")}, None)
    return (f"{job.get('nodes')} node(s) x {job.get('gpus_per_node')} {job.get('accelerator')} "
            f"= {_gpus(job.get('total_gpus'))}")


def _gpus(total) -> str:
    """``1 GPU`` or ``16 GPUs``: ``total`` the job's ``total_gpus`` as the API gives it (a whole number)."""
    return f"{total} GPU" if total == 1 else f"{total} GPUs"


def _pods_line(res: dict, accelerator: str | None) -> str:
    """``2 node(s) x 8 H100-80GB``, or for pods without GPUs ``3 node(s) x 1 CPU cores, 2 GiB (CPU-only, no GPUs)``:
    ``res`` a spec's (or a role's) ``resources``."""
    gpus = res.get("gpus_per_node")
    if isinstance(gpus, (int, float)) and gpus:
        return f"{res.get('nodes')} node(s) x {gpus:g} {res.get('accelerator') or accelerator}"
    memory = f", {res['memory_gib']:g} GiB" if isinstance(res.get("memory_gib"), (int, float)) else ""
    cpu = f"{res['cpu']:g}" if isinstance(res.get("cpu"), (int, float)) else "?"
    return f"{res.get('nodes')} node(s) x {cpu} CPU cores{memory} (CPU-only, no GPUs)"


def job_fields(job: dict) -> list[tuple[str, str]]:
    """``cpctl job``'s lines: team, kind, state, why it waits, the jobs it runs after, resources, priority, limits, attempt, cost, times."""
    pairs: list[tuple[str, str]] = [
        ("team", f"{job['team']} (submitted by {job.get('submitter')})"),
        ("kind", job.get("kind")),
        ("state", job["state"] + (f": {job['state_reason']}" if job.get("state_reason") else "")),
    ]
    info = job.get("queue_info") or {}
    if job["state"] in ("QUEUED", "RECOVERING") and (info.get("reason") or info.get("message")):
        pairs.append(("waiting for", f"{info.get('reason', '?')}: {info.get('message', '')}".rstrip(": ")))
    if job.get("after"):  # the jobs it runs after (a pipeline), each with whether its condition holds
        pairs.append(("after", "; ".join(
            f"job {a['job']} ({a.get('name')}) {a.get('condition')}: {a.get('state')}, "
            + ("met" if a.get("met") else "never met" if job["state"] == "REJECTED" else "not met yet")
            for a in job["after"])))
    position = job.get("position")
    if position:
        pairs.append(("queue position", (f"{position.get('team', '?')} in team {job['team']}, "
                                         f"{position.get('overall', '?')} overall")))
    pairs += [
        ("resources", resources_line(job)),
        ("priority", f"{job.get('priority_class') or '-'} ({job.get('priority')})"
                     + (", preemptible" if job.get("preemptible") else "")),
        ("limits", (f"max runtime {duration(job['max_runtime_seconds']) if job.get('max_runtime_seconds') else 'none'}, "
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
        pairs.append(("attempt", text))
    if job.get("kind") == "inference":
        source = (job.get("spec") or {}).get("checkpoint_from")
        if source:
            pairs.append(("serves", f"the checkpoint of job {source}"))
        pairs.append(("endpoint", job.get("endpoint") or "none (it serves only while RUNNING)"))
        pairs += serving_fields(job.get("serving") or {})
        pairs += rollout_fields(job.get("serving") or {})
    estimate = job.get("estimated_cost_usd")
    pairs.append(("cost", f"{money(job, 'accrued_cost_usd')} accrued, " + (
        "estimated once placed" if estimate is None else f"{usd(estimate)} estimated (worst case)")))
    if job.get("kind") == "training" and (job.get("efficiency") or {}).get("attempts"):  # a server trains nothing
        pairs += efficiency_fields(job["efficiency"])
    for name in ("created", "admitted", "started", "ended"):
        value = job.get(f"{name}_at")
        if value:
            pairs.append((name, f"{when(value)} UTC ({age(value)} ago)"))
    return pairs


def rollout_fields(serving: dict) -> list[tuple[str, str]]:
    """A serving job's followed training job and its latest rollout (the API's ``serving.follow`` and
    ``serving.rollout``): what it follows, and the rollout's state, checkpoints, progress and what started it;
    [] for neither."""
    pairs = []
    follow = serving.get("follow")
    if follow:
        what = (f"training job {follow['job']}" if isinstance(follow["job"], int)
                else f"the runs of training job {follow['job']}")
        newest = f" (newest succeeded: job {follow['newest_run']})" if follow.get("newest_run") else ""
        pairs.append(("follows", f"{what}: each newer run that succeeds is rolled out to{newest}"))
    rollout = serving.get("rollout")
    if rollout:
        text = (f"{rollout['state'].replace('_', ' ')}: from the checkpoint of job {rollout['from']} to that of job "
                f"{rollout['to']}, {rollout['replicas_updated']} replica(s) updated")
        if rollout.get("trigger"):
            text += f"; started because job {rollout['trigger']}, which it follows, succeeded"
        for key in ("note", "reason"):
            if rollout.get(key):
                text += f"; {rollout[key]}"
        pairs.append(("rollout", text))
    return pairs


def serving_fields(serving: dict) -> list[tuple[str, str]]:
    """A serving job's replicas and, with autoscaling, its bounds, target, last decision and the reason a scale-up
    was refused (the API's ``serving``); [] without it."""
    if not serving:
        return []
    pairs = [("replicas", str(serving.get("replicas")) + (
        f" ({', '.join(serving['replica_addresses'])})" if serving.get("replica_addresses") else ""))]
    scaling = serving.get("autoscaling")
    if scaling:
        metric = "in flight" if scaling.get("metric") == "in_flight" else "requests/s"
        text = (f"{scaling['min_replicas']}..{scaling['max_replicas']} replicas, target "
                f"{scaling['target_per_replica']} {metric} per replica")
        if scaling.get("desired") is not None:
            text += f"; last read {scaling['metric_per_replica']:.2f}, decided {scaling['desired']}"
        if scaling.get("note"):
            text += f"; {scaling['note']}"
        pairs.append(("autoscaling", text))
        refusal = scaling.get("refusal") or {}
        if refusal:
            pairs.append(("scale-up refused", f"{refusal.get('desired')} wanted, stays at {refusal.get('replicas')}: "
                                              f"{refusal.get('message', '')}"))
    return pairs + figures_fields(serving.get("figures"))


def figures_fields(figures: dict | None) -> list[tuple[str, str]]:
    """A serving job's figures over the last hour it served (the API's ``serving.figures``): requests, rate,
    latency percentiles, error rate, GPU-hours, cost per million requests and tokens (``unknown`` without a price),
    replicas over time; [] before the first sample."""
    if not figures:
        return []
    text = f"{figures['requests']} requests"
    if figures.get("requests_per_second") is not None:
        text += f" ({figures['requests_per_second']:.2f}/s)"
    if figures.get("latency_p50_ms") is not None:
        text += f", p50 {figures['latency_p50_ms']:.1f} ms, p99 {figures['latency_p99_ms']:.1f} ms"
    if figures.get("error_rate_percent") is not None:
        text += f", errors {figures['error_rate_percent']:.2f} %"
    if figures.get("tokens"):
        text += f", {figures['tokens']} tokens"
    pairs = [("served (last hour)", text + f"; {figures['gpu_hours']:.4f} GPU-h")]
    if figures["requests"]:
        cost = f"{_known(figures.get('usd_per_million_requests'))}, {figures['gpu_hours_per_million_requests']:.2f} GPU-h"
        if figures.get("tokens"):
            cost += f"; per million tokens {_known(figures.get('usd_per_million_tokens'))}"
        if figures.get("unpriced_gpu_hours"):
            cost += f" ({figures['unpriced_gpu_hours']:.2f} GPU-h without a price)"
        pairs.append(("per million requests", cost))
    series = figures.get("replicas") or []
    if series:
        pairs.append(("replicas over time", ", ".join(f"{n} from {when(at)}" for at, n in series) + " UTC"))
    return pairs


def _known(value: str | None) -> str:
    """An API money string as ``$1.23``; None (no price known) as ``unknown``, never ``$0``."""
    return "unknown" if value is None else f"${value}"


@api_command("job", "show a job: state, why it waits, attempt, cost")
@job_id
def job(api: Api, id: int) -> int:  # noqa: A002 - the argument's name in the usage line
    """One job's details: state and why it waits, resources, attempt, cost, times."""
    body = api.client.get(f"jobs/{id}/")
    if api.shown_as_json(body):
        return EXIT_OK
    out(f"job {body['id']}  {body['name']}")
    fields(job_fields(body))
    if body.get("roles"):
        out()
        roles_table(body["roles"])
    return EXIT_OK


def throughput_text(role: dict) -> str:
    """A role's throughput (API ``roles.<name>``): ``1,234.5 tok/s``, with each pod's for a role of several pods
    (``-`` for a pod that reported none); ``-`` when none reported."""
    total = role.get("tokens_per_s")
    if total is None:
        return "-"
    text = f"{total:,.1f} tok/s"
    pods = role.get("pod_tokens_per_s") or []
    if len(pods) > 1:
        text += " (" + ", ".join("-" if t is None else f"{t:,.1f}" for t in pods) + ")"
    return text


def roles_table(roles: dict) -> None:
    """A multi-role job's ``roles`` (API) as a table: pods, GPUs, GPU-hours, cost, GPU utilization, idle
    GPU-hours, how utilization was attributed, and throughput, as the job page shows them."""
    table(["ROLE", "PODS", "GPUS", "GPU-H", "COST", "GPU UTIL", "IDLE GPU-H", "ATTRIBUTED BY", "THROUGHPUT"],
          [[name, r.get("pods"), r.get("gpus"), gpu_hours(r.get("gpu_hours")), usd(r.get("cost_usd")),
            percent(r.get("gpu_utilization_percent")),
            "n/a" if r.get("idle_gpu_hours") is None else gpu_hours(r["idle_gpu_hours"]),
            r.get("attribution") or "-", throughput_text(r)] for name, r in roles.items()],
          right=("PODS", "GPUS", "GPU-H", "COST", "GPU UTIL", "IDLE GPU-H", "THROUGHPUT"))


def mfu_text(mfu, reason: str) -> str:
    """``"41.20 %"``, or ``"n/a (why)"`` when the API gives no MFU."""
    return "n/a" + (f" ({reason})" if reason else "") if mfu is None else f"{mfu:.2f} %"


def efficiency_fields(efficiency: dict) -> list[tuple[str, str]]:
    """The job's ``efficiency`` (API) as ``cpctl job`` lines: throughput, MFU, tokens and USD per million."""
    tokens_per_s = efficiency.get("tokens_per_s")
    pairs = [("throughput", "not reported" if tokens_per_s is None else f"{tokens_per_s:,.1f} tokens/s"),
             ("MFU", mfu_text(efficiency.get("mfu_percent"), efficiency.get("mfu_reason") or ""))]
    if efficiency.get("tokens") is not None:
        per_million = efficiency.get("usd_per_million_tokens")
        pairs.append(("tokens", f"{efficiency['tokens']:,}" + (
            "" if per_million is None else f", ${shown_amount(per_million)} per million")))  # as its page
    return pairs


@api_command("efficiency", "show a job's training throughput, MFU and cost per million tokens")
@job_id
def efficiency(api: Api, id: int) -> int:  # noqa: A002
    """A job's training efficiency per attempt: last and mean throughput, loss, MFU, tokens."""
    body = api.client.get(f"jobs/{id}/efficiency/")
    if api.shown_as_json(body):
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


@api_command("events", "show a job's timeline")
@job_id
def events(api: Api, id: int) -> int:  # noqa: A002
    """The job's timeline, oldest first: time, kind, state change, attempt, actor, reason."""
    page = api.client.get_pages(f"jobs/{id}/events/")
    if api.shown_as_json(page):
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


# --- logs and cancel --------------------------------------------------------------------------------------------------

@api_command("logs", "show the log of a job's current attempt")
@job_id
@click.option("--node", type=int, default=0, help="node index, 0-based (default 0)")
@click.option("--tail", type=POSITIVE_INT, default=200, help="trailing lines (default 200)")
@click.option("-f", "--follow", is_flag=True, help="stream new lines until the attempt ends")
def logs(api: Api, id: int, node: int, tail: int, follow: bool) -> int:  # noqa: A002
    """The tail of one node's log of the job's current attempt; ``--follow`` streams new lines as they come."""
    params = {"node": node, "tail": tail}
    if not follow:
        body = api.client.get(f"jobs/{id}/logs/", params)
        if api.json:
            print_json(body)
        elif body.get("attempt") is None:
            err(f"job {id} has no attempt yet: no logs")
        else:
            text = body.get("text") or ""
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
            if not text:
                err(empty_log_hint(api.client, id, node, body.get("attempt")))
        return EXIT_OK
    if api.json:
        raise CliError(EXIT_BAD_INPUT, "error: --json cannot be combined with --follow (the stream is plain text)")
    return stream_log(api.client, id, params)


def stream_log(client: Client, job: int, params: dict) -> int:
    """Copy the followed log of ``job`` to stdout as its bytes arrive (UTF-8); the exit code (130 on Ctrl-C)."""
    response = client.request("GET", f"jobs/{job}/logs/", params={**params, "follow": 1}, stream=True,
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


def empty_log_hint(client: Client, job: int, node: int, attempt: int) -> str:
    """What to tell a user whose node log is empty: that the node printed nothing (``yet`` while the job lives, ``in
    this attempt`` once it ended), and which nodes there are: from another node, rank 0 (in distributed training
    often only rank 0 prints); from rank 0, the next node."""
    try:
        body = client.get(f"jobs/{job}/")
        nodes, final = body.get("nodes") or 1, body.get("state") in FINAL_STATES
    except CliError:
        nodes, final = None, False
    others = ""
    if nodes and nodes > 1:
        others = (f"; the job has {nodes} nodes (0 to {nodes - 1}) and often only rank 0 prints: try --node 0"
                  if node else f"; the job has {nodes} nodes (0 to {nodes - 1}): try --node 1")
    return f"(node {node} of attempt {attempt} has printed nothing {'in this attempt' if final else 'yet'}{others})"


@api_command("cancel", "cancel a job")
@job_id
def cancel(api: Api, id: int) -> int:  # noqa: A002
    """Cancel the job: CANCELLED at once when nothing runs, else CANCELLING until the cluster confirms."""
    body = api.client.post(f"jobs/{id}/cancel/")
    if api.json:
        print_json(body)
    elif body["state"] == "CANCELLING":
        out(f"job {body['id']}: CANCELLING (its cluster is deleting it; `cpctl job {body['id']}` shows when it is "
            "CANCELLED)")
    else:
        out(f"job {body['id']}: {body['state']}")
    return EXIT_OK


@api_command("rollout", "move a serving job to the checkpoint of another training job, replica by replica")
@job_id
@click.option("--checkpoint-from-job", "checkpoint_from_job", type=POSITIVE_INT, required=True,
              help="the SUCCEEDED training job of the same team whose checkpoint the replicas load")
def rollout(api: Api, id: int, checkpoint_from_job: int) -> int:  # noqa: A002
    """Start a rolling update of serving job ID (``POST /jobs/ID/rollout/``): one new replica at a time, ready
    before an old one retires, rolled back if a new one fails readiness; ``cpctl job ID`` follows it."""
    body = api.client.post(f"jobs/{id}/rollout/", {"checkpoint_from_job": checkpoint_from_job})
    if api.json:
        print_json(body)
    else:
        out(f"job {id}: rolling from the checkpoint of job {body['from']} to that of job {body['to']} "
            f"({body['state']}; `cpctl job {id}` shows its progress)")
    return EXIT_OK


COMMANDS = [submit, resubmit, jobs, job, events, efficiency, cancel, logs, rollout]
