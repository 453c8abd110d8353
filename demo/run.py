"""The main job end to end on this machine: seed, start the platform, train, serve, charge.

``manage.py demo`` (``make demo``) migrates, seeds two teams with quotas and
budgets, the local cluster, the price catalog, a staff account and the
daily reports, starts the web server, a Celery worker for each queue (fast
and slow) and Celery beat as child processes, submits a pipeline at once through the REST API with a real
token: a PyTorch training job, its evaluation on a held-out text (``after`` the training SUCCEEDED) and the
serving of the trained model (an inference job naming the training job, ``spec.checkpoint_from``, ``after``
the evaluation SUCCEEDED: ADR 0037), with a CPU-only data-preparation job for the local CPU pool, a GRPO job of
a learner and two rollouts admitted as one (a multi-role job: ADR 0039), three jobs side by side on shared and
whole GPUs (a quarter of a time-sliced GPU, a 1g.10gb MIG device, a whole GPU: ADR 0040, on the shared nodes
``DEMO_SHARED_NODES`` gives the emulated cluster), and a job the budget must refuse; follows them to a final state as the scheduler runs them in order, sends the served
model's endpoint a request,
asks the API for ml-research's report of the day (on demand) and prints a
summary with the endpoint, the answer and the report. With ``--once`` it then
cancels the serving job, stops, and exits 0 only if training SUCCEEDED with
a lower final loss, the evaluation passed its threshold, the CPU-only job
SUCCEEDED billed at the CPU price, the GRPO job SUCCEEDED with its reward
risen, the three GPU-sharing jobs SUCCEEDED side by side each holding what it
asked, and the served model answered.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import requests
import yaml
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from core.money import usd_cents
from quotas.models import ApiToken, Budget, Membership, Quota, Team
from runners.models import Accelerator

from .processes import Supervisor, embedded_broker_command, wait_for_port

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED"}
LOSS_LINE = re.compile(r"^step=(\d+) loss=([0-9.]+)", re.MULTILINE)
EVAL_LINE = re.compile(r"^eval_loss=([0-9.]+) perplexity=([0-9.]+)", re.MULTILINE)
#: The GRPO learner's last line (examples/rl_grpo.py): its last and its first mean reward.
RL_FINAL_LINE = re.compile(r"^final step=\d+ reward=([-0-9.]+) first_reward=([-0-9.]+)", re.MULTILINE)
#: Learner steps of the demo's GRPO job: enough for its reward to rise from a fresh model, a few seconds of CPU.
RL_STEPS = 20
#: The shared nodes the demo's emulated cluster gets unless ``LOCAL_RUNNER_SHARED_NODES`` is set (runners.local.sharing):
#: one GPU time-sliced four ways, and one GPU cut into two 1g.10gb MIG devices and one 3g.40gb (mixed strategy).
DEMO_SHARED_NODES = "time-slicing:1x4;mig-mixed:1x1g.10gb=2,3g.40gb=1"
#: What examples/gpu_share.py prints of what it holds.
HOLDS_LINE = re.compile(r"^holds (.*)$", re.MULTILINE)
#: Seconds each GPU-sharing job works: long enough that the three overlap after their dispatches.
SHARE_SECONDS = 20


@dataclasses.dataclass
class DemoTeam:
    """A seeded team, its admin user, that user's web password and API token key (both new on every seed; the
    previous seed's demo token is revoked)."""

    slug: str
    username: str
    password: str
    token: str


STAFF_USERNAME = "admin"


def seed_staff() -> str:
    """Create (idempotently) the platform staff account ``admin`` (staff and superuser: the Django admin at
    ``/admin/`` and every team's objects) with a fresh password; returns the password."""
    password = secrets.token_urlsafe(9)
    user, _ = get_user_model().objects.get_or_create(username=STAFF_USERNAME)
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    return password


def seed_reports() -> int:
    """Generate the daily reports (every team and the platform, the last complete UTC day) so the Reports page
    has something from the start (the schedules run at 06:00 UTC); no mail is sent. Returns how many."""
    from costs.models import Report
    from costs.reports.build import generate_report, period_window

    start, end = period_window(Report.Kind.DAILY)
    for team in [*Team.objects.all(), None]:
        generate_report(team, start, end, Report.Kind.DAILY)
    return Team.objects.count() + 1


def report_on_demand(api: Api, port: int) -> str:
    """Ask the API for ml-research's report of today (UTC) so far, as a user would (``POST reports/``, what
    ``cpctl build-report`` sends), so the Reports page holds one with the demo's own jobs; returns the summary line
    (or why it failed: the demo goes on)."""
    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        report = api.post_json("reports/", {"team": "ml-research", "start": today.isoformat(),
                                            "end": (today + dt.timedelta(days=1)).isoformat()})
    except (RuntimeError, requests.RequestException) as exc:
        return f"  report on demand FAILED: {exc}"
    totals = report["data"]["totals"]
    return (f"  report {report['id']} (on demand, ml-research, {today:%Y-%m-%d} UTC): {totals['gpu_hours']:.4f} "
            f"GPU-hours, ${totals['cost_usd']}  http://127.0.0.1:{port}/reports/{report['id']}/  "
            f"(cpctl report {report['id']})")


def seed_demo() -> dict[str, DemoTeam]:
    """Create (idempotently) the catalog, the local cluster, two teams with quotas and budgets, and users with tokens.

    ``ml-research``: 4 nominal + 4 borrowable GPUs of the local accelerator,
    a $5,000 monthly budget that alerts. ``applied-ml``: 2 nominal GPUs and a
    $5 monthly budget that blocks, so a one-hour job on an H100 is refused.
    Returns the teams keyed by slug; token keys are new on every call.
    """
    from runners.local.capacity import ensure_local_cluster, gpu_pool

    call_command("seed_catalog", verbosity=0)
    cluster = ensure_local_cluster()
    accelerator = Accelerator.objects.get(pk=gpu_pool(cluster).accelerator_id)
    User = get_user_model()
    teams = {}
    for slug, name, username, nominal, borrowing, amount, action in [
        ("ml-research", "ML Research", "alice", 4, 4, "5000", Budget.Action.ALERT),
        ("applied-ml", "Applied ML", "bob", 2, 0, "5", Budget.Action.BLOCK),
    ]:
        team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name, "cost_center": f"cc-{slug}"})
        user, _ = User.objects.get_or_create(username=username)
        password = secrets.token_urlsafe(9)  # a fresh one per demo run, printed for the web UI's sign-in
        user.set_password(password)
        user.save()
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": Membership.Role.ADMIN})
        Quota.objects.get_or_create(
            team=team, accelerator=accelerator, cluster=None,
            defaults={"nominal_gpus": nominal, "borrowing_limit_gpus": borrowing},
        )
        Budget.objects.get_or_create(team=team, period=Budget.Period.MONTHLY,
                                     defaults={"amount_usd": Decimal(amount), "action": action})
        ApiToken.objects.filter(user=user, name="demo").delete()  # an earlier run's token stops working
        _, key = ApiToken.issue(user, "demo")
        teams[slug] = DemoTeam(slug, username, password, key)
    call_command("ensure_report_schedules", verbosity=0)
    return teams


def lift_cordons(out) -> list[str]:
    """Uncordon the nodes of the demo's local cluster that an earlier run left cordoned (a staff cordon outlives
    the demo's processes), saying so on ``out``: the demo's training job needs every node of that cluster, and
    would otherwise wait, never placeable, until its timeout. Each lift is audited with its reason. Returns the
    names of the nodes lifted."""
    from runners import health
    from runners.local.capacity import ensure_local_cluster
    from runners.models import Node

    lifted = []
    for node in Node.objects.filter(cluster=ensure_local_cluster(), cordoned=True).order_by("name"):
        health.uncordon(node, None, reason="the demo needs every node of its local cluster")
        out.write(f"Node {node.name} was left cordoned ({node.cordon_note or 'no note'}); the demo uncordoned it, "
                  f"since its training job needs every node of the local cluster.\n")
        lifted.append(node.name)
    return lifted


def use_own_address_for_links(port: int) -> str:
    """Make the links in notifications point at this demo's web server when ``NOTIFY_BASE_URL`` is not set:
    ``http://127.0.0.1:<port>`` in the settings and in the environment its web server, workers and beat inherit.
    ``port``: the web server's TCP port. Returns the base URL in force (a configured one is kept)."""
    if not settings.NOTIFY_BASE_URL:
        settings.NOTIFY_BASE_URL = f"http://127.0.0.1:{port}"
    os.environ["NOTIFY_BASE_URL"] = settings.NOTIFY_BASE_URL
    return settings.NOTIFY_BASE_URL


def use_shared_nodes() -> str:
    """Give the demo's emulated cluster the shared nodes ``DEMO_SHARED_NODES`` unless ``LOCAL_RUNNER_SHARED_NODES``
    is set (an empty value keeps none): in the settings and in the environment the web server, workers and beat
    inherit. Returns the configuration in force."""
    if "LOCAL_RUNNER_SHARED_NODES" not in os.environ:
        settings.LOCAL_RUNNER_SHARED_NODES = DEMO_SHARED_NODES
        os.environ["LOCAL_RUNNER_SHARED_NODES"] = DEMO_SHARED_NODES
    return settings.LOCAL_RUNNER_SHARED_NODES


def local_sharing() -> list[str]:
    """The sharing modes of the local cluster's shared nodes (none: no GPU sharing job can be placed; a machine
    with NVIDIA GPUs has none, ``runners.local.capacity``)."""
    from runners.local.capacity import ensure_local_cluster
    from runners.models import Node

    return sorted(set(Node.objects.filter(cluster=ensure_local_cluster()).exclude(gpu_sharing="none")
                      .values_list("gpu_sharing", flat=True)))


def sharing_documents(seconds: float = SHARE_SECONDS) -> list[dict]:
    """Three jobs of ml-research that run side by side for ``seconds`` (examples/gpu_share.py): a quarter of a GPU
    (``gpus_per_node: 0.25``, placed on a time-sliced GPU), a MIG device (``mig_profile: 1g.10gb``) and a whole
    GPU, on the local accelerator."""
    def document(name: str, resources: dict) -> dict:
        return {"team": "ml-research", "name": name, "kind": "training",
                "spec": {"image": "python:3.11", "command": ["python", "examples/gpu_share.py"],
                         "args": ["--seconds", str(seconds)],
                         "resources": {"accelerator": settings.LOCAL_RUNNER_ACCELERATOR, "nodes": 1, **resources},
                         "max_runtime_seconds": 600}}

    return [document("gpu-quarter", {"gpus_per_node": 0.25}),
            document("gpu-mig-1g10gb", {"gpus_per_node": 1, "mig_profile": "1g.10gb"}),
            document("gpu-whole", {"gpus_per_node": 1})]


#: What each GPU-sharing job must hold: its name -> the ``holds`` fields it must print.
SHARING_EXPECTED = {"gpu-quarter": {"sharing": "time-slicing", "share": "0.25"},
                    "gpu-mig-1g10gb": {"sharing": "mig-mixed", "share": "0.125", "mig_profile": "1g.10gb"},
                    "gpu-whole": {"sharing": "none", "share": "whole"}}


def sharing_text(api: Api, views: dict[int, dict], utilization=None) -> tuple[list[str], bool]:
    """The summary's lines of the GPU-sharing jobs (``views``: id -> last view): per job its state, what it printed
    it holds, its GPU-hours and cost, and the words of ``utilization(job id)`` when given (``utilization_text``);
    then whether they ran side by side (every attempt started before any ended). Each is billed its share:
    ``billed <GPU-hours> = <share> x <hours run>``. The bool: all SUCCEEDED, each held what ``SHARING_EXPECTED``
    says and was billed its share (``billed_share``), side by side."""
    lines, ok, spans = [], True, []
    for job_id, view in views.items():
        held: dict[str, str] = {}
        hours = 0.0
        if view.get("current_attempt"):
            found = HOLDS_LINE.search(api.get(f"jobs/{job_id}/logs/", node=0, tail=200)["text"])
            held = dict(part.split("=", 1) for part in found.group(1).split()) if found else {}
            for attempt in api.get(f"jobs/{job_id}/attempts/")["results"]:
                if attempt["started_at"] and attempt["ended_at"]:
                    spans.append((dt.datetime.fromisoformat(attempt["started_at"]),
                                  dt.datetime.fromisoformat(attempt["ended_at"])))
                    hours += (spans[-1][1] - spans[-1][0]).total_seconds() / 3600
        gpu_hours, cost = job_cost(api, job_id) if view.get("current_attempt") else (0.0, "0.00")
        share = Decimal(view.get("gpu_share_milli") or 1000 * view["gpus_per_node"]) / 1000
        billed = billed_share(gpu_hours, share, hours)
        want = SHARING_EXPECTED.get(view["name"], {})
        ok = ok and view["state"] == "SUCCEEDED" and all(held.get(k) == v for k, v in want.items()) and billed
        where = " ".join(f"{k}={held[k]}" for k in ("sharing", "share", "node", "gpu", "mig_profile", "mig_instance")
                         if held.get(k, "-") != "-")
        lines.append(f"  job {job_id} {view['name']:<20} {view['state']:<10} holds {where or 'nothing said'}  "
                     f"billed {gpu_hours:.6f} GPU-h {'=' if billed else 'is NOT'} {share.normalize()} x {hours:.6f} h  "
                     f"cost ${cost}"
                     + (utilization(job_id) if utilization is not None and view.get("current_attempt") else ""))
    side_by_side = len(spans) == len(views) and max(s for s, _ in spans) < min(e for _, e in spans)
    lines.append("  the three ran side by side on one cluster" if side_by_side
                 else "  the three did NOT all run at the same time")
    return lines, ok and side_by_side


def billed_share(gpu_hours: float, share: Decimal, hours: float) -> bool:
    """Whether a job was billed its share: ``gpu_hours`` (the costs API's, 6 decimals) is ``share`` (GPUs: 0.25, a
    MIG device's eighths, 1 for a whole GPU) x ``hours`` its attempts ran, to the API's rounding (half of 1e-6, and
    as much again for the attempts' times, which the API gives to the microsecond)."""
    return abs(gpu_hours - float(share) * hours) <= 1e-6


class PortInUse(RuntimeError):
    """The demo's web port is taken; the message says which and what to do."""


class Platform:
    """The embedded broker, the web server, a Celery worker per queue and Celery beat as supervised child processes
    of the demo (``demo.processes.Supervisor``: one that exits is restarted), logging under ``var/logs``."""

    def __init__(self, port: int, out=sys.stdout):
        self.port = port
        self.log_dir = Path(settings.VAR_DIR) / "logs"
        self.supervisor = Supervisor(settings.BASE_DIR, self.log_dir, out)

    @property
    def procs(self) -> list[subprocess.Popen]:
        return self.supervisor.procs

    def start(self) -> None:
        py = sys.executable
        celery = [py, "-m", "celery", "-A", "controlplane"]
        use_own_address_for_links(self.port)
        if settings.EMBEDDED_BROKER:
            port = settings.EMBEDDED_BROKER_PORT
            broker = self.supervisor.start("broker", embedded_broker_command(port, Path(settings.VAR_DIR) / "celery"))
            if not wait_for_port(port, alive=lambda: broker.process.poll() is None):
                raise RuntimeError(f"the embedded broker did not start on port {port}:\n"
                                   f"{self.supervisor.log_tail(broker)}")
        self.supervisor.start("web", [py, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload"])
        # One worker per queue (docs/adr/0014), as in production: a report or a utilization collection on the slow
        # worker never holds up a dispatch or a reconcile on the fast one. One pool process each on the demo's cores.
        for queue in (settings.CELERY_FAST_QUEUE, settings.CELERY_SLOW_QUEUE):
            self.supervisor.start(f"worker-{queue}", celery + [
                "worker", "--loglevel=INFO", "--concurrency=1", "-Q", queue, "--without-gossip", "--without-mingle",
                "--hostname", f"demo-{queue}-{os.getpid()}@%h"])
        self.supervisor.start("beat", celery + ["beat", "--loglevel=INFO",
                                                "--pidfile", str(Path(settings.VAR_DIR) / "celerybeat.pid")])
        self.supervisor.watch()

    def check_port_free(self) -> None:
        """Raise PortInUse with a one-line explanation when something already listens on the port (or on the
        embedded broker's)."""
        if settings.EMBEDDED_BROKER and wait_for_port(settings.EMBEDDED_BROKER_PORT, timeout=0.2):
            raise PortInUse(f"port {settings.EMBEDDED_BROKER_PORT} on 127.0.0.1 (the embedded broker's) is in use "
                            f"(an earlier demo still running?); stop it or choose another: "
                            f"EMBEDDED_BROKER_PORT=6391 make demo")
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", self.port))
            except OSError:
                raise PortInUse(f"port {self.port} on 127.0.0.1 is in use (an earlier demo still running?); "
                                   f"stop it or choose another port: make demo PORT=8001") from None

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait for our own web server's /readyz to answer 200. Raises RuntimeError with the web log's tail otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.supervisor.healthy:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        tail = (self.log_dir / "web.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the platform did not become ready; web log:\n{tail}")

    def stop(self) -> None:
        """SIGTERM each process (a Celery worker then stops its own pool: a warm shutdown), SIGKILL stragglers."""
        self.supervisor.stop()


class Api:
    """A tiny REST client for the demo: ``Authorization: Token <key>`` against ``/api/v1/``."""

    def __init__(self, port: int, token: str):
        self.base = f"http://127.0.0.1:{port}/api/v1/"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def get(self, path: str, **params) -> dict:
        r = self.session.get(self.base + path, params=params, timeout=30)
        r.raise_for_status()
        return r.json()

    def post(self, path: str) -> dict:
        """POST without a body (an action such as ``jobs/N/cancel/``); raises RuntimeError on an error status."""
        r = self.session.post(self.base + path, timeout=30)
        if r.status_code >= 400:
            raise RuntimeError(f"POST {path} answered {r.status_code}: {r.text}")
        return r.json()

    def refusal(self, path: str, document: dict) -> str:
        """POST ``document`` that submission must refuse; its 400's messages, joined. RuntimeError when it is
        accepted (a job was stored) or answered otherwise."""
        r = self.session.post(self.base + path, data=yaml.safe_dump(document),
                              headers={"Content-Type": "application/yaml"}, timeout=30)
        if r.status_code != 400:
            raise RuntimeError(f"POST {path} should have been refused (400) but answered {r.status_code}: {r.text}")
        return "; ".join(f"{field}: {' '.join(messages)}" for field, messages in r.json().items())

    def post_json(self, path: str, body: dict) -> dict:
        """POST ``body`` as JSON; raises RuntimeError on an error status."""
        r = self.session.post(self.base + path, json=body, timeout=60)
        if r.status_code >= 400:
            raise RuntimeError(f"POST {path} answered {r.status_code}: {r.text}")
        return r.json()

    def post_yaml(self, path: str, document: dict) -> dict:
        r = self.session.post(self.base + path, data=yaml.safe_dump(document),
                              headers={"Content-Type": "application/yaml"}, timeout=30)
        if r.status_code >= 400:
            raise RuntimeError(f"POST {path} answered {r.status_code}: {r.text}")
        return r.json()


def training_document(steps: int, nodes: int) -> dict:
    """The example training job spec (examples/jobs/train-gpt.yaml) sized for the demo."""
    doc = yaml.safe_load((Path(settings.BASE_DIR) / "examples/jobs/train-gpt.yaml").read_text())
    doc["team"] = "ml-research"
    doc["spec"]["args"] = ["--steps", str(steps)]
    doc["spec"]["resources"]["nodes"] = nodes
    doc["spec"]["resources"]["accelerator"] = settings.LOCAL_RUNNER_ACCELERATOR
    return doc


def evaluation_document(training_job_id: int) -> dict:
    """The example evaluation job spec (examples/jobs/evaluate-gpt.yaml) for the demo: it runs ``after`` training
    job ``training_job_id`` SUCCEEDED and reads that job's checkpoint from the local runner's directory of it
    (``EVAL_CHECKPOINT_DIR``), on the local accelerator."""
    from runners.local.runner import checkpoint_dir

    doc = yaml.safe_load((Path(settings.BASE_DIR) / "examples/jobs/evaluate-gpt.yaml").read_text())
    doc["team"] = "ml-research"
    doc["after"] = [{"job": training_job_id, "condition": "succeeded"}]
    doc["spec"]["env"]["EVAL_CHECKPOINT_DIR"] = str(checkpoint_dir(training_job_id))
    doc["spec"]["resources"]["accelerator"] = settings.LOCAL_RUNNER_ACCELERATOR
    return doc


def serving_document(training_job_id: int, after_job_id: int | None = None) -> dict:
    """The example serving job spec (examples/jobs/serve-gpt.yaml) for the demo: it serves the checkpoint of
    training job ``training_job_id`` (``spec.checkpoint_from``) on the local accelerator, ``after`` job
    ``after_job_id`` (the evaluation) SUCCEEDED when one is given."""
    doc = yaml.safe_load((Path(settings.BASE_DIR) / "examples/jobs/serve-gpt.yaml").read_text())
    doc["team"] = "ml-research"
    doc["spec"]["checkpoint_from"] = training_job_id
    doc["spec"]["resources"]["accelerator"] = settings.LOCAL_RUNNER_ACCELERATOR
    if after_job_id is not None:
        doc["after"] = [{"job": after_job_id, "condition": "succeeded"}]
    return doc


def rl_document(steps: int = RL_STEPS) -> dict:
    """The GRPO example (examples/jobs/rl-grpo.yaml) for the demo: a multi-role job of one learner and two rollouts
    on the CPU pool, admitted as one (ADR 0039), its learner taking ``steps`` policy-gradient steps."""
    doc = yaml.safe_load((Path(settings.BASE_DIR) / "examples/jobs/rl-grpo.yaml").read_text())
    doc["team"] = "ml-research"
    args = doc["spec"]["roles"]["learner"]["args"]
    args[args.index("--steps") + 1] = str(steps)
    return doc


def rl_text(api: Api, view: dict) -> tuple[str, bool]:
    """The GRPO job's summary after its state: the learner's first and last mean reward (its pod is node 0, the
    first role's) and each role's pods and cost (``roles`` of the job's answer, USD); and whether its reward rose."""
    text, rose = "", False
    if view.get("current_attempt"):
        job_cost(api, view["id"])  # waits for the final accrual, so each role's cost is whole
        found = RL_FINAL_LINE.search(api.get(f"jobs/{view['id']}/logs/", node=0, tail=1000)["text"])
        if found:
            last, first = float(found.group(1)), float(found.group(2))
            rose = last > first
            text += f"  reward {first:.3f} -> {last:.3f}"
    roles = api.get(f"jobs/{view['id']}/").get("roles") or {}
    parts = [f"{name} {r['pods']} pod{'s' if r['pods'] != 1 else ''} "
             + ("unpriced" if r.get("cost_usd") is None else f"${r['cost_usd']}") for name, r in roles.items()]
    if parts:
        text += "  per role: " + ", ".join(parts)
    return text, rose


DEMO_PROMPT = "To be, or not to be"


def ask(endpoint: str, timeout: float, prompt: str = DEMO_PROMPT) -> str:
    """POST ``prompt`` to ``<endpoint>/generate`` (examples/serve.py) once ``/healthz`` answers; the generated
    text. Raises RuntimeError when the server does not answer 200 within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = requests.post(f"{endpoint}/generate", json={"prompt": prompt, "max_new_tokens": 48, "seed": 0,
                                                           "temperature": 0.8}, timeout=30)
            if r.status_code == 200:
                return r.json()["text"]
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except requests.RequestException as exc:  # not listening yet: it loads the checkpoint first
            last = str(exc)
        time.sleep(1)
    raise RuntimeError(f"{endpoint} did not answer within {timeout:g} s: {last}")


def serve(api: Api, job: dict, timeout: float, out) -> tuple[dict, str | None, str, bool]:
    """Wait for the submitted serving job ``job`` (its view) to run, and ask its endpoint one question.

    Returns ``(the job's last view, its endpoint or None, the answer or why there is none, whether it answered)``.
    """
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        job = api.get(f"jobs/{job['id']}/")
        if job["state"] != seen:
            seen = job["state"]
            reason = f" ({job['state_reason']})" if job.get("state_reason") else ""
            out.write(f"  job {job['id']} {job['name']}: {job['state']}{reason}\n")
            out.flush()
        if job["state"] in FINAL:
            return job, None, f"the serving job ended {job['state']}: {job['state_reason']}", False
        if job["state"] == "RUNNING" and job.get("endpoint"):
            out.write(f"  endpoint {job['endpoint']}\n")
            try:
                return job, job["endpoint"], ask(job["endpoint"], max(5.0, deadline - time.monotonic())), True
            except RuntimeError as exc:
                return api.get(f"jobs/{job['id']}/"), job["endpoint"], str(exc), False
        time.sleep(1)
    return job, None, f"the serving job was still {job['state']} after {timeout:g} s", False


def over_budget_document() -> dict:
    """A one-hour, one-GPU job for applied-ml, whose $5 block budget cannot pay for it."""
    return {
        "team": "applied-ml", "name": "too-expensive-sweep", "kind": "training",
        "spec": {
            "image": "python:3.11", "command": ["python", "-c", "print('never runs')"],
            "resources": {"accelerator": settings.LOCAL_RUNNER_ACCELERATOR, "gpus_per_node": 1, "nodes": 1},
            "max_runtime_seconds": 3600,
        },
    }


def cpu_document() -> dict:
    """A CPU-only data-preparation job for ml-research (``gpus_per_node: 0``: 1 node of 1 vCPU and 1 GiB) that
    runs on the local cluster's CPU pool, quota-free (the team has no CPU quota), billed per vCPU-hour and
    GiB-hour (ADR 0012)."""
    return {
        "team": "ml-research", "name": "prepare-data", "kind": "training",
        "spec": {
            "image": "python:3.11",
            "command": ["python", "-c", "import time; rows = sum(range(10**6)); time.sleep(3); "
                                        "print(f'prepared {rows} rows', flush=True)"],
            "resources": {"gpus_per_node": 0, "nodes": 1, "cpu": 1, "memory_gib": 1},
            "max_runtime_seconds": 600,
        },
    }


def cpu_ledger(job_id: int) -> tuple[Decimal, Decimal, Decimal | None]:
    """What the ledger holds for CPU-only job ``job_id``: vCPU-hours, GiB-hours and USD (1e-9; None when no entry
    was priced), summed over its cost entries (each ``cpu_milli`` and ``memory_mib`` over its interval)."""
    from costs.models import CostEntry

    vcpu_hours = gib_hours = Decimal(0)
    usd = None
    for entry in CostEntry.objects.filter(job_id=job_id):
        hours = Decimal((entry.interval_end - entry.interval_start).total_seconds()) / 3600
        vcpu_hours += Decimal(entry.cpu_milli) / 1000 * hours
        gib_hours += Decimal(entry.memory_mib) / 1024 * hours
        if entry.amount_usd is not None:
            usd = (usd or Decimal(0)) + entry.amount_usd
    return vcpu_hours, gib_hours, usd


def efficiency_text(efficiency: dict) -> str:
    """The summary's words for a training job's ``efficiency`` (the API's, as its page shows it): throughput
    (tokens/s), MFU (percent, or why none) and USD per million tokens, each when known (beat collects them every
    15 s: maybe not yet); empty when none is."""
    text = ""
    if efficiency.get("tokens_per_s") is not None:
        mfu = efficiency.get("mfu_percent")
        text += f"  {efficiency['tokens_per_s']:.0f} tokens/s, MFU " + (
            "n/a (CPU)" if mfu is None and "CPU" in efficiency.get("mfu_reason", "") else
            "n/a" if mfu is None else f"{mfu:.2f}%")
    if efficiency.get("usd_per_million_tokens") is not None:
        text += f"  ${usd_cents(Decimal(efficiency['usd_per_million_tokens']))} per million tokens"  # as its page
    return text


def utilization_text(util: float | None, *, emulated: bool, monitored: bool) -> str:
    """The summary's words for a job's average GPU utilization ``util`` (percent, the figure its page and the API
    show; None: none collected): shown whenever collected, on emulated GPUs with what it measures there (the CPU use
    of the job's processes, as the local exporter reports it); else why there is none. ``monitored``: Prometheus
    runs (``prometheus`` on PATH)."""
    if util is not None:
        return f"  GPU util {util:.1f}%" + (" (emulated GPUs: the CPU use of its processes)" if emulated else "")
    if not monitored:
        return "  GPU util not observed (no prometheus on PATH)"
    return "  GPU util no data"


def losses(log_text: str) -> tuple[float, float] | None:
    """The first and last training loss printed as ``step=N loss=X`` lines, or None."""
    found = LOSS_LINE.findall(log_text)
    if not found:
        return None
    return float(found[0][1]), float(found[-1][1])


def follow(apis: dict[int, Api], timeout: float, out) -> dict[int, dict]:
    """Poll each job (id -> client) until it is final, printing every state change; returns the last views."""
    seen: dict[int, str] = {}
    views: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job_id, api in apis.items():
            view = api.get(f"jobs/{job_id}/")
            views[job_id] = view
            if seen.get(job_id) != view["state"]:
                seen[job_id] = view["state"]
                reason = f" ({view['state_reason']})" if view.get("state_reason") else ""
                out.write(f"  job {job_id} {view['name']}: {view['state']}{reason}\n")
                out.flush()
        if all(v["state"] in FINAL for v in views.values()):
            return views
        time.sleep(1)
    return views


def job_cost(api: Api, job_id: int, timeout: float = 90) -> tuple[float, str]:
    """GPU-hours and cost (USD, cents) of a finished job from ``/costs/?group_by=job``.

    Waits until every attempt's ledger reaches its end (``accrued_until ==
    ended_at``): the final accrual runs in the worker just after the job ends.
    """
    deadline = time.monotonic() + timeout
    while True:
        attempts = api.get(f"jobs/{job_id}/attempts/")["results"]
        final = all(a["ended_at"] is None or a["started_at"] is None or a["accrued_until"] == a["ended_at"]
                    for a in attempts)
        if final or time.monotonic() > deadline:
            rows = [r for r in api.get("costs/", group_by="job", start="2000-01-01T00:00:00Z",
                                       end="2100-01-01T00:00:00Z").get("results", []) if r.get("job") == job_id]
            return (rows[0]["gpu_hours"], rows[0]["cost_usd"]) if rows else (0.0, "0.00")
        time.sleep(1)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cancel_unfinished(job_ids: list[int]) -> list[int]:
    """Cancel, and delete the processes of, every unfinished job that could run on this machine after the demo:
    the demo's own jobs (``job_ids``) and any job with a live attempt on the local cluster (one a user
    submitted while the demo ran), so nothing outlives the demo. Jobs still QUEUED elsewhere are left alone.
    Returns the ids of the jobs cancelled."""
    from django.db.models import Q

    from jobs.lifecycle import NotCancellable, cancel_job, finish_cancel
    from jobs.models import Job
    from jobs.states import StaleState
    from runners.local.capacity import ensure_local_cluster

    local = ensure_local_cluster()
    cancelled = []
    unfinished = Job.objects.exclude(state__in=FINAL).filter(
        Q(pk__in=job_ids) | Q(attempts__cluster=local, attempts__ended_at__isnull=True)).distinct()
    for job in unfinished:
        try:
            cancel_job(job)
            finish_cancel(job.pk)
            cancelled.append(job.pk)
        except (NotCancellable, StaleState):
            pass
    return cancelled


def run_demo(*, once: bool, port: int, steps: int, nodes: int, timeout: float, out) -> int:
    """Run the demo; returns the process exit status (0 when training succeeded, its loss fell and the served
    model answered a request)."""
    platform = Platform(port, out)
    platform.check_port_free()  # before any work: a busy port is the commonest reason a demo cannot start
    call_command("migrate", verbosity=0)
    use_shared_nodes()
    teams = seed_demo()
    lift_cordons(out)
    staff_password = seed_staff()
    seed_reports()
    from runners.local.exporter import (
        job_average_utilization,
        start_demo_monitoring,
        stop_demo_monitoring,
    )

    # SIGINT (even when inherited as ignored), SIGTERM and SIGHUP stop the demo like Ctrl-C: the
    # finally below then cancels the unfinished jobs running here and stops every process it started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    monitoring = start_demo_monitoring(port, out)  # GPU metrics when `prometheus` is on PATH; None otherwise
    out.write(f"Starting the platform on http://127.0.0.1:{port}/ (web, Celery workers of the fast and slow queues, "
              f"Celery beat)...\n")
    alice, bob = teams["ml-research"], teams["applied-ml"]
    accounts = (f"  Web UI sign-in: {alice.username} / {alice.password} (ml-research admin), "
                f"{bob.username} / {bob.password} (applied-ml admin); team admins request quota and budget "
                "changes (Requests), staff approve them\n"
                f"  Staff: {STAFF_USERNAME} / {staff_password} (every team; admin at http://127.0.0.1:{port}/admin/)\n")
    out.write(accounts + f"  API tokens: {alice.username} {alice.token}  {bob.username} {bob.token}\n")
    platform.start()
    submitted: list[int] = []
    try:
        platform.wait_ready()
        research = Api(port, teams["ml-research"].token)
        applied = Api(port, teams["applied-ml"].token)
        clusters = research.get("clusters/")["results"]
        emulated = any(c.get("emulated") for c in clusters)
        for c in clusters:
            note = " (emulated GPUs: jobs run on the CPU)" if c.get("emulated") else ""
            out.write(f"Cluster {c['name']} [{c['provider']}/{c['region']}]{note}\n")
        # The pipeline at once: the scheduler admits each job only once the one before it SUCCEEDED (ADR 0037).
        train = research.post_yaml("jobs/", training_document(steps, nodes))
        evaluation = research.post_yaml("jobs/", evaluation_document(train["id"]))
        serving = research.post_yaml("jobs/", serving_document(train["id"], evaluation["id"]))
        prep = research.post_yaml("jobs/", cpu_document())
        rl = research.post_yaml("jobs/", rl_document())  # three roles admitted as one (ADR 0039)
        # Its budget can never cover it: refused at submission, as a job over its quota is (ADR 0036).
        sweep = over_budget_document()
        outcome = applied.post_yaml("jobs/preview/", sweep)["outcome"]
        refused = applied.refusal("jobs/", sweep)
        submitted += [train["id"], evaluation["id"], serving["id"], prep["id"], rl["id"]]
        # Part of a GPU, a MIG device and a whole GPU side by side (ADR 0040), where the local cluster shares GPUs.
        modes = local_sharing()
        sharing = [research.post_yaml("jobs/", doc) for doc in sharing_documents()] if modes else []
        submitted += [job["id"] for job in sharing]
        out.write(f"Submitted the pipeline at once: job {train['id']} ({train['name']}), job {evaluation['id']} "
                  f"({evaluation['name']}) after it succeeds, job {serving['id']} ({serving['name']}, serving the "
                  f"checkpoint of job {train['id']}) after that succeeds; and CPU-only job {prep['id']} "
                  f"({prep['name']}); job {rl['id']} ({rl['name']}: a GRPO learner and two rollouts admitted as one); "
                  f"{sweep['name']} was refused at submission (its preview said {outcome}).\n"
                  f"  job {serving['id']} {serving['name']}: QUEUED ({serving['state_reason']})\n")
        named = ", ".join(f"{j['id']} ({j['name']})" for j in sharing)
        out.write(f"Submitted GPU-sharing jobs {named} on the local "
                  f"cluster's {' and '.join(modes)} nodes beside its whole GPUs.\n" if sharing else
                  "No GPU-sharing jobs: the local cluster has no shared nodes (NVIDIA GPUs found, or "
                  "LOCAL_RUNNER_SHARED_NODES empty).\n")
        started = time.monotonic()
        views = follow({train["id"]: research, evaluation["id"]: research, prep["id"]: research, rl["id"]: research,
                        **{job["id"]: research for job in sharing}}, timeout, out)

        served, endpoint, answer, answered = serve(research, serving, max(60.0, timeout - (time.monotonic() - started)),
                                                   out)
        if served is not None and once and served["state"] not in FINAL:
            research.post(f"jobs/{served['id']}/cancel/")  # the demo is over: stop serving, as a user would
            served = follow({served["id"]: research}, 60, out)[served["id"]]

        trained = False
        out.write("\nSummary\n")
        out.write(f"  {sweep['name']:<27} REFUSED    at submission: {refused}\n")
        for job_id, api in ((train["id"], research),):
            view = views[job_id]
            gpu_hours, cost = job_cost(api, job_id) if view.get("current_attempt") else (0.0, "0.00")
            line = f"  job {job_id} {view['name']:<20} {view['state']:<10} GPU-hours {gpu_hours:.4f}  cost ${cost}"
            if job_id == train["id"]:
                logs = api.get(f"jobs/{job_id}/logs/", node=0, tail=100000)["text"]
                pair = losses(logs)
                if pair:
                    line += f"  loss {pair[0]:.4f} -> {pair[1]:.4f}"
                trained = view["state"] == "SUCCEEDED" and pair is not None and pair[1] < pair[0]
                line += efficiency_text(api.get(f"jobs/{job_id}/").get("efficiency") or {})
            util = (job_average_utilization(job_id) if monitoring is not None and view.get("current_attempt")
                    else None)
            line += utilization_text(util, emulated=emulated, monitored=monitoring is not None)
            out.write(line + "\n")
        evaluated = views[evaluation["id"]]["state"] == "SUCCEEDED"
        scored = None
        if views[evaluation["id"]].get("current_attempt"):
            scored = EVAL_LINE.search(research.get(f"jobs/{evaluation['id']}/logs/", node=0, tail=1000)["text"])
        out.write(f"  job {evaluation['id']} {views[evaluation['id']]['name']:<20} "
                  f"{views[evaluation['id']]['state']:<10} "
                  + (f"held-out loss {scored.group(1)} (perplexity {scored.group(2)}), threshold "
                     f"{evaluation['spec']['env']['EVAL_MAX_LOSS']}" if scored
                     else views[evaluation["id"]]["state_reason"]) + "\n")
        prepared = views[prep["id"]]["state"] == "SUCCEEDED"
        if views[prep["id"]].get("current_attempt"):
            job_cost(research, prep["id"])  # waits for its final accrual
        vcpu_hours, gib_hours, cpu_usd = cpu_ledger(prep["id"])
        prepared = prepared and cpu_usd is not None and cpu_usd > 0
        out.write(f"  job {prep['id']} {views[prep['id']]['name']:<20} {views[prep['id']]['state']:<10} "
                  f"vCPU-hours {vcpu_hours:.6f}  GiB-hours {gib_hours:.6f}  cost "
                  + ("unpriced" if cpu_usd is None else f"${usd_cents(cpu_usd)}") + " (CPU pool, per vCPU-hour and GiB-hour)\n")
        rl_line, rl_rose = rl_text(research, views[rl["id"]])
        reinforced = views[rl["id"]]["state"] == "SUCCEEDED" and rl_rose
        out.write(f"  job {rl['id']} {views[rl['id']]['name']:<20} {views[rl['id']]['state']:<10}"
                  + (rl_line or f"  {views[rl['id']]['state_reason']}") + "\n")
        shared_ok = True
        if sharing:
            lines, shared_ok = sharing_text(
                research, {job["id"]: views[job["id"]] for job in sharing},
                lambda job_id: utilization_text(job_average_utilization(job_id) if monitoring is not None else None,
                                                emulated=emulated, monitored=monitoring is not None))
            out.write("\n".join(lines) + "\n")
        if served is not None:
            gpu_hours, cost = job_cost(research, served["id"]) if served.get("current_attempt") else (0.0, "0.00")
            out.write(f"  job {served['id']} {served['name']:<20} {served['state']:<10} GPU-hours {gpu_hours:.4f}  "
                      f"cost ${cost}  endpoint {endpoint or 'none'}\n")
        if answered:
            out.write(f"  request  POST {endpoint}/generate {json.dumps({'prompt': DEMO_PROMPT})}\n"
                      f"  answer   {json.dumps(answer)}\n")
        else:
            out.write(f"  serving FAILED: {answer}\n")
        out.write(report_on_demand(research, port) + "\n")
        ok = trained and evaluated and answered and prepared and reinforced and shared_ok
        out.write("Demo OK: training succeeded, its loss fell, the evaluation passed, the CPU-only job succeeded and "
                  "was billed, the GRPO job's reward rose, "
                  + ("the GPU-sharing jobs ran side by side, each billed its share, " if sharing else "")
                  + "and the served model answered.\n" if ok
                  else "Demo FAILED.\n")
        if not once:
            serving = f"  Serving job {served['id']} answers at {endpoint}/generate\n" if answered else ""
            out.write(f"\nThe platform keeps running at http://127.0.0.1:{port}/ (API /api/v1/, docs /api/docs/).\n"
                      + accounts + serving +
                      f"  API token for {alice.username}: {alice.token}\n"
                      "Press Ctrl-C to stop.\n")
            out.flush()
            while platform.supervisor.healthy:
                time.sleep(1)
            out.write(f"The demo stops: {platform.supervisor.failure}\n")
            return 1
        return 0 if ok else 1
    except KeyboardInterrupt:
        # Ctrl-C is how the README stops the demo: a normal end, exit status 0 (make then reports no error).
        out.write("\nStopped by Ctrl-C.\n")
        return 0
    finally:
        # Shutting down must finish: make passes a group's SIGTERM on to us a second time, and a Ctrl-C
        # pressed twice would otherwise abort the cleanup and leave the servers and training running.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        out.write("Stopping the platform...\n")
        out.flush()
        try:
            if platform.supervisor.healthy:
                cancelled = cancel_unfinished(submitted)
                if cancelled:
                    out.write(f"Cancelled unfinished job(s) {', '.join(map(str, cancelled))} so no process outlives "
                              f"the demo.\n")
            else:  # a component failed, not the user: their jobs stay as they are, for the next run to recover
                out.write("Jobs are left as they are; the next `make demo` recovers them.\n")
        except Exception as exc:  # noqa: BLE001 - the database is gone: say so, and still stop every process
            out.write(f"Could not cancel the unfinished jobs ({type(exc).__name__}: {exc}); they stay as they are "
                      f"for the next run.\n")
        finally:
            platform.stop()
        stop_demo_monitoring(monitoring)
