"""Bounded work per request: the server CPU that the worst bad inputs cost, against a valid small submission.

Run: ``.venv/bin/python benchmarks/bad_input.py`` (PostgreSQL at ``BENCH_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/cp_bench_bad_input``, recreated on each run; Redis at ``BENCH_BROKER_URL``,
default ``redis://127.0.0.1:6379/11``, flushed on each run: the broker and the rate limits' cache, as in
production; ``--repeat N``, default 3, requests per kind; ``--baseline N``, default 30).

It starts the web server as the Kubernetes manifest runs it (``platform/kubernetes/base/web.yaml``'s gunicorn
command: gthread, one worker of 8 threads, the project's gunicorn hooks) on 127.0.0.1, signs in to the web UI
once, and sends each kind of bad input ``--repeat`` times over one keep-alive connection (a new one when the
server closed it): to ``POST /api/v1/jobs/`` (YAML and JSON: the largest document under each cap with a costly
shape — node floods, many keys, deep nesting, anchors, long keys, huge numbers —, bodies over the caps, malformed
UTF-8, lone surrogates), to the UI's submission form (the same YAML shapes in its YAML box, a 2 MB form, malformed
UTF-8), a wrong token and a wrong password. The server's CPU per request is the gunicorn process tree's user +
system time (``/proc``) over the kind's requests, divided by their number; the baseline is a valid small JSON
submission (201), measured the same way in the same run.

Ends with one JSON line: ``worst_request_server_cpu_ms`` and ``worst_request_kind``, ``kinds`` (per kind: server
CPU ms per request, statuses, answer bytes, wall ms), ``baseline_server_cpu_ms``, ``worst_over_baseline``, and
``goal_met`` (worst < 1,000 ms: a bad request costs under a second of server CPU, the budget of docs/adr/0033).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procstat import machine, tree_cpu_seconds  # noqa: E402
from benchmarks.services import postgres_missing, redis_missing, require  # noqa: E402
from benchmarks.submit import free_port, prepare, wait_up  # noqa: E402

#: The caps the inputs are shaped against (controlplane/settings.py, core/limits.py).
SPEC_MAX = 64 * 1024
YAML_MAX = 4 * SPEC_MAX
GOAL_MS = 1000
PASSWORD = "bench-password-1"  # noqa: S105 (the benchmark's own user, in its own database)

HEAD = (
    "team: bench\nname: bad\nkind: training\nspec:\n  image: python:3.11\n  command: [python, train.py]\n"
    "  max_runtime_seconds: 600\n  resources: {accelerator: H100-80GB, gpus_per_node: 1, nodes: 1}\n"
)
VALID = {
    "team": "bench",
    "name": "ok",
    "kind": "training",
    "spec": {
        "image": "python:3.11",
        "command": ["python", "train.py"],
        "max_runtime_seconds": 600,
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1},
    },
}


def fill(prefix: str, unit, cap: int, suffix: str = "") -> str:
    """``prefix`` + ``unit(i)`` for i = 0, 1, ... + ``suffix``, as long as possible within ``cap`` bytes (UTF-8)."""
    parts, size, i = [prefix], len(prefix.encode()) + len(suffix.encode()), 0
    while True:
        piece = unit(i)
        if size + len(piece.encode()) > cap:
            return "".join(parts) + suffix
        parts.append(piece)
        size += len(piece.encode())
        i += 1


def yaml_documents() -> dict[str, str]:
    """The costly YAML shapes, each the largest under its cap: the YAML cap (256 KiB), the node cap
    (``JOB_SPEC_MAX_BYTES // 2`` nodes) or libyaml's nesting limit."""
    under_nodes = (SPEC_MAX // 2 - 40) // 2  # keys (2 nodes each) under the node cap, with the head's nodes
    return {
        "yaml_flow_sequence_at_cap": fill(HEAD + "  args: [", lambda i: "1,", YAML_MAX - 1, "1]\n"),
        "yaml_many_keys_at_cap": fill(HEAD + "  env:\n", lambda i: f"    K{i}: v\n", YAML_MAX - 1),
        "yaml_anchors_at_cap": fill(HEAD + "  args: [", lambda i: f"&a{i} x,", YAML_MAX - 1, "x]\n"),
        "yaml_extra_keys_under_node_cap": fill(HEAD, lambda i: f"k{i}: 1\n", YAML_MAX - 1)
        if under_nodes * 9 > YAML_MAX
        else HEAD + "".join(f"k{i}: 1\n" for i in range(under_nodes)),
        "yaml_bad_env_names_under_spec_cap": fill(HEAD + "  env:\n", lambda i: f"    '{i}': v\n", SPEC_MAX - 200),
        "yaml_long_keys_at_cap": fill(HEAD, lambda i: f"k{i}{'x' * 2000}: 1\n", YAML_MAX - 1),
        "yaml_deep_nesting": HEAD.replace(
            "  command: [python, train.py]\n", "  command: " + "[" * 999 + "]" * 999 + "\n"
        ),
        "yaml_alias_bomb": HEAD + "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n",
        "yaml_huge_integers_at_cap": fill(HEAD + "  args: [", lambda i: "9" * 4200 + ",", YAML_MAX - 1, "1]\n"),
        "yaml_comments_at_cap": fill(HEAD, lambda i: "#" + "c" * 78 + "\n", YAML_MAX - 1),
        "yaml_valid_env_under_spec_cap": fill(HEAD + "  env:\n", lambda i: f"    K{i}: v\n", SPEC_MAX - 300),
    }


def json_bodies() -> dict[str, bytes]:
    """JSON bodies: nesting, keys and numbers at the JSON cap, lone surrogates, malformed UTF-8."""
    head = json.dumps(VALID)[:-1]
    return {
        "json_deep_nesting_at_cap": ("[" * (YAML_MAX - 2) + "]").encode(),
        "json_extra_keys_at_cap": fill(head, lambda i: f',"k{i}":1', YAML_MAX - 1, "}").encode(),
        "json_spec_keys_at_cap": fill(
            '{"team": "bench", "name": "bad", "kind": "training", "spec": {',
            lambda i: f'"k{i}": 1, ',
            YAML_MAX - 1,
            '"k": 1}}',
        ).encode(),
        "json_huge_number": ('{"team": ' + "9" * (YAML_MAX - 20) + "}").encode(),
        "json_lone_surrogates_at_cap": fill(
            '{"team": "bench", "name": "', lambda i: "\\ud800", YAML_MAX - 3, '"}'
        ).encode(),
        "json_malformed_utf8": json.dumps(VALID).encode().replace(b"python:3.11", b"python\xff\xfe3.11"),
    }


class Client:
    """One keep-alive HTTP/1.1 connection to the server, reopened when the server closed it.

    The body goes out in 64 KiB pieces, and the client stops sending as soon as the server has answered (a
    refusal before the body was read, as a careful client does), so an early 413 is read, not lost to a reset.
    ``dropped_keepalive`` counts requests that failed on a connection the previous answer said was kept alive.
    """

    def __init__(self, port: int):
        self.port = port
        self.sock = None
        self.dropped_keepalive = 0

    def _exchange(self, method: str, path: str, body: bytes | None, headers: dict):
        body = body or b""
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        while sent < len(body):
            if select.select([self.sock], [], [], 0)[0]:
                break  # the server answered before reading the whole body
            try:
                sent += self.sock.send(body[sent : sent + 65536])
            except OSError:
                break  # it closed its side: its answer may still be readable
        response = http.client.HTTPResponse(self.sock, method=method)
        response.begin()
        data = response.read()
        answer: dict[str, str] = {}
        for name, value in response.getheaders():  # repeated headers (Set-Cookie) joined with ", "
            answer[name.lower()] = f"{answer[name.lower()]}, {value}" if name.lower() in answer else value
        return response.status, data, answer, sent < len(body)

    def send(self, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, bytes, dict]:
        """Status, body and headers (lower-case names) of one request; status 0 when no answer came."""
        reused = self.sock is not None
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=120)
        try:
            status, data, answer, cut_short = self._exchange(method, path, body, headers)
        except (OSError, http.client.HTTPException):
            self.close()
            if not reused:
                return 0, b"", {}
            self.dropped_keepalive += 1  # the previous answer said keep-alive, and this request found it gone
            return self.send(method, path, body, headers)
        if cut_short or answer.get("connection", "").lower() == "close":
            self.close()
        return status, data, answer

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def sign_in(client: Client) -> dict:
    """Sign in to the web UI as the benchmark's user; the cookies and the CSRF token its form POSTs need."""
    status, body, headers = client.send("GET", "/login/", None, {})
    if status != 200:
        raise RuntimeError(f"the sign-in page answered {status}")
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', body.decode()).group(1)
    cookie = headers["set-cookie"].split(";")[0]
    form = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "username": "bench", "password": PASSWORD})
    status, body, headers = client.send(
        "POST", "/login/", form.encode(), {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
    )
    if status != 302:
        raise RuntimeError(f"sign-in answered {status}")
    cookies = {
        c.split("=", 1)[0].strip(): c.split("=", 1)[1].split(";")[0]
        for c in re.split(r",(?=\s*\w+=)", headers["set-cookie"])
    }
    csrf_cookie = cookies.get("csrftoken", cookie.split("=", 1)[1])
    return {"cookie": f"csrftoken={csrf_cookie}; sessionid={cookies['sessionid']}", "csrf": csrf_cookie}


def ui_form(ui: dict, fields: dict) -> tuple[bytes, dict]:
    """A form POST body (urlencoded, with the CSRF token) and its headers."""
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": ui["csrf"], **fields}).encode()
    return body, {"Content-Type": "application/x-www-form-urlencoded", "Cookie": ui["cookie"]}


def requests_by_kind(token: str, ui: dict) -> dict[str, tuple[str, str, bytes, dict]]:
    """kind -> (method, path, body, headers): every bad input this benchmark sends."""
    api_yaml = {"Authorization": f"Token {token}", "Content-Type": "application/yaml"}
    api_json = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    kinds: dict[str, tuple[str, str, bytes, dict]] = {}
    documents = yaml_documents()
    for name, text in documents.items():
        kinds[f"api_{name}"] = ("POST", "/api/v1/jobs/", text.encode(), api_yaml)
    kinds["api_yaml_over_cap"] = ("POST", "/api/v1/jobs/", (HEAD + "#" * YAML_MAX).encode(), api_yaml)
    kinds["api_yaml_malformed_utf8"] = ("POST", "/api/v1/jobs/", HEAD.encode() + b"  x: \xff\xfe\xfd\n", api_yaml)
    kinds["api_body_2mb"] = ("POST", "/api/v1/jobs/", (HEAD + "#" * (2 * 1024 * 1024)).encode(), api_yaml)
    kinds["api_body_20mb"] = ("POST", "/api/v1/jobs/", b"[" * (20 * 1024 * 1024), api_json)
    for name, body in json_bodies().items():
        kinds[f"api_{name}"] = ("POST", "/api/v1/jobs/", body, api_json)
    for name in (
        "yaml_flow_sequence_at_cap",
        "yaml_extra_keys_under_node_cap",
        "yaml_long_keys_at_cap",
        "yaml_deep_nesting",
        "yaml_many_keys_at_cap",
        "yaml_bad_env_names_under_spec_cap",
    ):
        kinds[f"ui_{name}"] = ("POST", "/jobs/new/", *ui_form(ui, {"spec_yaml": documents[name]}))
        kinds[f"ui_preview_{name}"] = ("POST", "/jobs/new/preview/", *ui_form(ui, {"spec_yaml": documents[name]}))
    kinds["ui_form_2mb"] = ("POST", "/jobs/new/", *ui_form(ui, {"spec_yaml": "#" * (2 * 1024 * 1024)}))
    body, headers = ui_form(ui, {"spec_yaml": "x"})
    kinds["ui_malformed_utf8"] = ("POST", "/jobs/new/", body.replace(b"spec_yaml=x", b"spec_yaml=%FF%FE%FD"), headers)
    kinds["api_wrong_token"] = (
        "POST",
        "/api/v1/jobs/",
        json.dumps(VALID).encode(),
        {**api_json, "Authorization": "Token " + "x" * 43},
    )
    sign_in_form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": ui["csrf"], "username": "bench", "password": "wrong"}
    ).encode()
    kinds["ui_wrong_password"] = (
        "POST",
        "/login/",
        sign_in_form,
        {"Content-Type": "application/x-www-form-urlencoded", "Cookie": f"csrftoken={ui['csrf']}"},
    )
    return kinds


def measure(client: Client, server_pid: int, request: tuple[str, str, bytes, dict], repeat: int) -> dict:
    """Send ``request`` ``repeat`` times; server CPU ms per request (the gunicorn tree), statuses, answer bytes,
    wall ms per request, and whether the server closed the connection after announcing keep-alive."""
    method, path, body, headers = request
    statuses, sizes = [], []
    dropped = client.dropped_keepalive
    cpu_before = tree_cpu_seconds(server_pid)
    t0 = time.perf_counter()
    for _ in range(repeat):
        status, data, _ = client.send(method, path, body, headers)
        statuses.append(status)
        sizes.append(len(data))
    wall = time.perf_counter() - t0
    time.sleep(0.05)  # the access log line and the thread's end are the request's too
    cpu = tree_cpu_seconds(server_pid) - cpu_before
    return {
        "server_cpu_ms": round(cpu * 1000 / repeat, 1),
        "statuses": sorted(set(statuses)),
        "answer_bytes": max(sizes),
        "wall_ms": round(wall * 1000 / repeat, 1),
        "body_bytes": len(body),
        "dropped_keepalive": client.dropped_keepalive - dropped,
    }


def manifest_command(port: int) -> list[str]:
    """The web Deployment's gunicorn command (platform/kubernetes/base/web.yaml), bound to 127.0.0.1:``port``."""
    for document in yaml.safe_load_all((ROOT / "platform/kubernetes/base/web.yaml").read_text()):
        if document and document.get("kind") == "Deployment":
            command = document["spec"]["template"]["spec"]["containers"][0]["command"]
            return [
                sys.executable,
                "-m",
                *[f"--bind=127.0.0.1:{port}" if c.startswith("--bind=") else c for c in command],
            ]
    raise RuntimeError("no Deployment in platform/kubernetes/base/web.yaml")


def prepare_user(env: dict) -> None:
    """Give the benchmark's user a password (the UI signs in with it)."""
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from django.contrib.auth import get_user_model\n"
            "u = get_user_model().objects.get(username='bench')\n"
            f"u.set_password('{PASSWORD}'); u.save()\n",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="requests per kind of bad input (default 3)")
    parser.add_argument("--baseline", type=int, default=30, help="valid small submissions measured (default 30)")
    args = parser.parse_args()

    env = dict(os.environ)
    env["DATABASE_URL"] = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_bench_bad_input")
    env["CELERY_BROKER_URL"] = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")
    env["CACHE_URL"] = env["CELERY_BROKER_URL"]  # rate limits counted in Redis, as with several web pods
    env["LOG_LEVEL"] = "WARNING"
    require("bad_input", [postgres_missing(env["DATABASE_URL"]), redis_missing(env["CELERY_BROKER_URL"])])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import redis

    redis.Redis.from_url(env["CELERY_BROKER_URL"]).flushdb()  # no rate limit counted by an earlier run
    token = prepare(env)
    prepare_user(env)
    port = free_port()
    log = open(ROOT / "var" / "bench-bad-input-gunicorn.log", "wb")  # noqa: SIM115 (closed in the finally)
    server = subprocess.Popen(manifest_command(port), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    results: dict[str, dict] = {}
    client = Client(port)
    try:
        wait_up(port)
        ui = sign_in(client)
        valid = (
            "POST",
            "/api/v1/jobs/",
            json.dumps(VALID).encode(),
            {"Authorization": f"Token {token}", "Content-Type": "application/json"},
        )
        measure(client, server.pid, valid, 3)  # warm-up: imports, connections, caches
        kinds = requests_by_kind(token, ui)
        for name, request in kinds.items():  # warm-up of each path (first-use imports), unmeasured
            if name not in ("ui_wrong_password", "api_wrong_token"):
                client.send(*request[:2], request[2], request[3])
        baseline = measure(client, server.pid, valid, args.baseline)
        for name, request in kinds.items():
            results[name] = measure(client, server.pid, request, args.repeat)
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=30)
        log.close()
    worst = max(results, key=lambda k: results[k]["server_cpu_ms"])
    worst_ms = results[worst]["server_cpu_ms"]
    print(
        json.dumps(
            {
                "benchmark": "bad_input",
                "repeat": args.repeat,
                "gunicorn": "platform/kubernetes/base/web.yaml",
                **machine(),
                "worst_request_server_cpu_ms": worst_ms,
                "worst_request_kind": worst,
                "baseline_server_cpu_ms": baseline["server_cpu_ms"],
                "baseline_statuses": baseline["statuses"],
                "worst_over_baseline": round(worst_ms / baseline["server_cpu_ms"], 1)
                if baseline["server_cpu_ms"]
                else None,
                "server_cpu_ms_by_kind": {k: v["server_cpu_ms"] for k, v in results.items()},
                "dropped_keepalive": sum(v["dropped_keepalive"] for v in results.values()),
                "kinds": results,
                "goal": {"worst_request_server_cpu_ms_max": GOAL_MS},
                "goal_met": worst_ms < GOAL_MS,
            }
        )
    )


if __name__ == "__main__":
    main()
