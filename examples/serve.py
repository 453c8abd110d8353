"""Serve the byte-level GPT trained by ``train_gpt.py`` over HTTP (standard library only).

Loads ``<checkpoint-dir>/checkpoint.pt`` (``--checkpoint-dir``, default env
``CHECKPOINT_DIR``), then listens on ``--host`` (default ``0.0.0.0``) and
``--port`` (default env ``PORT``, else 8000) with a ``ThreadingHTTPServer``.
Generation is serialised by a lock (one request at a time on the model).

Endpoints
    ``GET /healthz``
        ``200`` with body ``ok`` (the model is loaded before the socket is
        bound, so any answer means ready).

    Every answer carries ``X-Checkpoint`` (the checkpoint file or store URL
    the model was loaded from) and ``X-Checkpoint-Step`` (its training step),
    so a client, or a rolling update, can tell which model served it.
    ``GET /metrics``
        The server's load in the Prometheus text format, which the platform
        reads through the Kubernetes API server's pod proxy and sums over the
        replicas for the autoscaler (``runners/kubernetes/serving_load.py``):
        ``controlplane_server_requests_total`` (POST requests received),
        ``controlplane_server_in_flight`` (being answered now),
        ``controlplane_server_in_flight_seconds_total`` (requests in flight
        integrated over time) and ``controlplane_server_clock_seconds`` (Unix
        seconds, when read); for the service's figures,
        ``controlplane_server_request_duration_seconds`` (a histogram of the
        seconds from a POST request read to its answer written: cumulative
        ``_bucket{le}`` counts over ``LATENCY_BUCKETS``, ``_sum``, ``_count``),
        ``controlplane_server_errors_total`` (POST answers with a 5xx status)
        and ``controlplane_server_generated_tokens_total`` (tokens generated).

    ``POST /generate``
        Request JSON::

            {"prompt": str,               # required, 1..10000 characters
             "max_new_tokens": int,       # optional, 1..512 (default 64)
             "temperature": float,        # optional, 0..10 (default 1.0; 0 = greedy)
             "seed": int}                 # optional, for reproducible sampling

        Response ``200`` JSON::

            {"text": str,                 # the generated continuation (prompt excluded)
             "prompt": str, "max_new_tokens": int, "temperature": float,
             "checkpoint_step": int, "checkpoint": str,
             "generated_tokens": int,     # tokens generated (also the X-Generated-Tokens header)
             "latency_s": float}

        Invalid input gives ``400`` JSON
        ``{"error": "invalid_request", "field": <name>, "reason": <text>}``
        (``field`` is ``"body"`` for malformed JSON or a non-object body);
        bodies over 64 KiB give ``413``; unknown paths ``404``; wrong methods
        ``405``.

Tokens are UTF-8 bytes, so ``max_new_tokens`` counts bytes; a multi-byte
character cut at the end is rendered as U+FFFD.

With ``--checkpoint-uri`` (default env ``CHECKPOINT_URI``, an fsspec URI of
the training job's checkpoint store, see ``train_gpt.py``) and no local
``checkpoint.pt``, the file is downloaded from the store into the checkpoint
directory, also while waiting; when that directory is read-only (the
Kubernetes runner mounts ``/checkpoints`` read-only in inference pods), into
``<tmp>/checkpoint-store/<hash of the URI>/`` instead.

The process prints ``serving on http://HOST:PORT ...`` (flushed) once
listening; on SIGTERM/SIGINT it stops accepting connections, answers the
requests it has read (at most ``DRAIN_SECONDS``) and exits 0; it exits 2 if the checkpoint is
missing or unreadable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402

if __package__:
    from .gpt import (
        CHECKPOINT_FILENAME,
        GPT,
        ByteTokenizer,
        CheckpointStore,
        checkpoint_path,
        load_checkpoint,
        model_from_checkpoint,
    )
else:  # run as a script: make the sibling module importable
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpt import (  # type: ignore[no-redef]
        CHECKPOINT_FILENAME,
        GPT,
        ByteTokenizer,
        CheckpointStore,
        checkpoint_path,
        load_checkpoint,
        model_from_checkpoint,
    )

MAX_NEW_TOKENS = 512
DEFAULT_MAX_NEW_TOKENS = 64
MAX_TEMPERATURE = 10.0
MAX_PROMPT_CHARS = 10_000
MAX_BODY_BYTES = 64 * 1024
ALLOWED_FIELDS = ("prompt", "max_new_tokens", "temperature", "seed")
#: Upper bounds (seconds) of the latency histogram's buckets, the platform's endpoint's own
#: (``runners/local/endpoint.py``, ``LATENCY_BUCKETS``: prometheus_client's default buckets, 5 ms to 10 s, and 30,
#: 60, 120 and 300 s for long generations), so the replicas' buckets sum bound by bound; ``+Inf`` is added when shown.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
                   120.0, 300.0)


class RequestError(ValueError):
    """A client error in a request: which field and why."""

    def __init__(self, field: str, reason: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.status = status


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_generate_request(body: Any) -> dict[str, Any]:
    """Check a decoded ``/generate`` JSON body and fill in defaults.

    Returns ``{"prompt": str, "max_new_tokens": int, "temperature": float,
    "seed": int | None}``; raises :class:`RequestError` naming the first bad field.
    """
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    for key in body:
        if key not in ALLOWED_FIELDS:
            raise RequestError(str(key), f"unknown field (allowed: {', '.join(ALLOWED_FIELDS)})")

    if "prompt" not in body:
        raise RequestError("prompt", "is required")
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise RequestError("prompt", "must be a string")
    if not prompt:
        raise RequestError("prompt", "must not be empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise RequestError("prompt", f"must be at most {MAX_PROMPT_CHARS} characters")

    max_new_tokens = body.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not _is_int(max_new_tokens):
        raise RequestError("max_new_tokens", "must be an integer")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise RequestError("max_new_tokens", f"must be between 1 and {MAX_NEW_TOKENS}")

    temperature = body.get("temperature", 1.0)
    if not (_is_int(temperature) or isinstance(temperature, float)):
        raise RequestError("temperature", "must be a number")
    if not (math.isfinite(temperature) and 0.0 <= temperature <= MAX_TEMPERATURE):
        raise RequestError("temperature", f"must be between 0 and {MAX_TEMPERATURE:g}")

    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2**63):
        raise RequestError("seed", "must be a non-negative integer below 2**63")

    return {
        "prompt": prompt,
        "max_new_tokens": max_new_tokens,
        "temperature": float(temperature),
        "seed": seed,
    }


class Generator:
    """Thread-safe wrapper around a loaded :class:`GPT` for text completion."""

    def __init__(self, model: GPT, device: torch.device, checkpoint_step: int, checkpoint: str = "") -> None:
        self.model = model
        self.device = device
        self.checkpoint_step = checkpoint_step
        self.checkpoint = checkpoint  # the file (or store URL) the model was loaded from
        self.tokenizer = ByteTokenizer()
        self._lock = threading.Lock()

    def complete(self, prompt: str, max_new_tokens: int, temperature: float, seed: int | None) -> tuple[str, int]:
        """Return the ``max_new_tokens``-byte continuation of ``prompt`` as text, and how many tokens it has."""
        ids = torch.tensor([self.tokenizer.encode(prompt)], dtype=torch.long, device=self.device)
        rng = None
        if seed is not None:
            rng = torch.Generator(device=self.device).manual_seed(seed)
        with self._lock:
            out = self.model.generate(ids, max_new_tokens, temperature=temperature, generator=rng)
        generated = out[0, ids.size(1) :].tolist()
        return self.tokenizer.decode(generated), len(generated)


class Load:
    """The server's load counters and its answers' figures (``GET /metrics``); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.errors = 0
        self.tokens = 0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, not cumulative; the last is +Inf
        self.latency_sum = 0.0
        self._integral = 0.0  # request-seconds in flight up to ``_since``
        self._since = time.monotonic()

    def _advance(self, by: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._integral += self.in_flight * (now - self._since)
            self._since = now
            self.in_flight += by
            self.requests += max(by, 0)

    def begin(self) -> None:
        """A request came in."""
        self._advance(1)

    def end(self) -> None:
        """A request was answered."""
        self._advance(-1)

    def observe(self, seconds: float, status: int, tokens: int = 0) -> None:
        """Count one answer of ``status`` written ``seconds`` after its request was read, with ``tokens``
        generated: the latency histogram (a bucket's bound is inclusive, Prometheus' ``le``), a 5xx as an error."""
        index = next((i for i, bound in enumerate(LATENCY_BUCKETS) if seconds <= bound), len(LATENCY_BUCKETS))
        with self._lock:
            self.latency_counts[index] += 1
            self.latency_sum += seconds
            self.errors += status >= 500
            self.tokens += tokens

    def exposition(self) -> bytes:
        """The counters in the Prometheus text format (version 0.0.4)."""
        now = time.monotonic()
        with self._lock:
            integral = self._integral + self.in_flight * (now - self._since)
            requests, in_flight, errors, tokens = self.requests, self.in_flight, self.errors, self.tokens
            counts, latency_sum = list(self.latency_counts), self.latency_sum
        histogram, cumulative = [], 0
        for bound, count in zip((*LATENCY_BUCKETS, math.inf), counts, strict=True):
            cumulative += count
            le = "+Inf" if math.isinf(bound) else repr(bound)
            histogram.append(f'controlplane_server_request_duration_seconds_bucket{{le="{le}"}} {cumulative}\n')
        return (
            "# TYPE controlplane_server_requests counter\n"
            f"controlplane_server_requests_total {requests}\n"
            "# TYPE controlplane_server_in_flight gauge\n"
            f"controlplane_server_in_flight {in_flight}\n"
            "# TYPE controlplane_server_in_flight_seconds counter\n"
            f"controlplane_server_in_flight_seconds_total {integral:.6f}\n"
            "# TYPE controlplane_server_clock_seconds gauge\n"
            f"controlplane_server_clock_seconds {time.time():.6f}\n"
            "# TYPE controlplane_server_errors counter\n"
            f"controlplane_server_errors_total {errors}\n"
            "# TYPE controlplane_server_generated_tokens counter\n"
            f"controlplane_server_generated_tokens_total {tokens}\n"
            "# TYPE controlplane_server_request_duration_seconds histogram\n"
            + "".join(histogram)
            + f"controlplane_server_request_duration_seconds_sum {latency_sum:.6f}\n"
            f"controlplane_server_request_duration_seconds_count {cumulative}\n"
        ).encode()


#: How long a stopping server waits for the requests it is answering (seconds): below the local runner's kill grace
#: (LOCAL_RUNNER_KILL_GRACE_SECONDS, 10 s) and Kubernetes' default terminationGracePeriodSeconds (30 s).
DRAIN_SECONDS = 8.0


class DrainingServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that counts the requests it is answering, so a stop can let them finish.

    A request is in flight from its connection's accept (a new connection carries one) or, on a kept-alive
    connection, from its request line, until its answer is written. Stopping (``drain``): the connections the
    kernel already completed are accepted from the listen backlog, then the listening socket is closed, so a
    later connection is refused at once (a proxy sends it to another replica, as a refused connection never
    reached this one); then the requests in flight are answered, each on a connection closed after it, for at
    most ``seconds``.
    """

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.draining = False
        self.idle = threading.Condition()

    def request_started(self) -> None:
        with self.idle:
            self.in_flight += 1

    def request_done(self) -> None:
        with self.idle:
            self.in_flight -= 1
            self.idle.notify_all()

    def process_request(self, request: Any, client_address: Any) -> None:
        self.request_started()  # given back when the connection's first request is answered (Handler)
        super().process_request(request, client_address)

    def drain(self, seconds: float) -> int:
        """Take the backlog's connections, close the listener, wait up to ``seconds`` for the requests in flight;
        returns how many were left."""
        self.draining = True
        self.socket.setblocking(False)
        while True:
            try:
                request, client_address = self.socket.accept()
            except OSError:  # BlockingIOError: the backlog is empty
                break
            request.setblocking(True)
            self.process_request(request, client_address)
        self.socket.close()
        with self.idle:
            self.idle.wait_for(lambda: self.in_flight == 0, timeout=seconds)
            return self.in_flight


class Handler(BaseHTTPRequestHandler):
    """HTTP handler; the model lives on ``self.server.generator``."""

    server_version = "gpt-serve/1"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self._status = 0  # the status of the answer being written (send_response), 0 before one
        self._tokens = 0  # tokens generated for it
        self._counted = True  # the connection's first request was counted at its accept (DrainingServer)
        self._load_started: float | None = None  # when the POST being answered was counted in the load, else None

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            if self._counted:
                self._counted = False
                self.server.request_done()  # type: ignore[attr-defined]

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed and not self._counted:  # a later request on a kept-alive connection
            self.server.request_started()  # type: ignore[attr-defined]
            self._counted = True
        if self.server.draining:  # type: ignore[attr-defined]
            self.close_connection = True
        return parsed

    # -- helpers ------------------------------------------------------------ #

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        generator: Generator = self.server.generator  # type: ignore[attr-defined]
        self.send_header("X-Checkpoint", generator.checkpoint)
        self.send_header("X-Checkpoint-Step", str(generator.checkpoint_step))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self._settle_load()  # before a byte goes out: a client holding the answer finds it counted
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send(status, (json.dumps(payload) + "\n").encode(), "application/json", headers)

    def _send_error(self, err: RequestError) -> None:
        self._send_json(err.status, {"error": "invalid_request", "field": err.field, "reason": err.reason})

    def _read_json(self) -> Any:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            raise RequestError("body", "Content-Length header is required", HTTPStatus.LENGTH_REQUIRED)
        try:
            length = int(length_header)
        except ValueError:
            raise RequestError("body", "invalid Content-Length") from None
        if length < 0:
            raise RequestError("body", "invalid Content-Length")
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body would poison keep-alive
            raise RequestError("body", f"must be at most {MAX_BODY_BYTES} bytes", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError("body", f"invalid JSON: {exc}") from None

    # -- routes ------------------------------------------------------------- #

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        """``GET /healthz``, ``GET /metrics``."""
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(HTTPStatus.OK, b"ok", "text/plain; charset=utf-8")
        elif path == "/metrics":
            load: Load = self.server.load  # type: ignore[attr-defined]
            self._send(HTTPStatus.OK, load.exposition(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/generate":
            self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "method_not_allowed"}, {"Allow": "POST"})
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": "not_found", "path": path})

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        """``POST /generate``, counted in the server's load while it is answered, and in the figures once answered
        (from its request line and headers read until its answer starts out, so a client that has the answer reads
        it counted in ``/metrics``; an answer never written counts as a 500)."""
        load: Load = self.server.load  # type: ignore[attr-defined]
        load.begin()
        self._load_started = time.monotonic()
        self._status, self._tokens = 0, 0
        try:
            self._post()
        finally:
            self._settle_load()

    def _settle_load(self) -> None:
        """Take the POST being answered out of the load and count its answer in the figures; once per request,
        a no-op for any other."""
        if self._load_started is None:
            return
        load: Load = self.server.load  # type: ignore[attr-defined]
        started, self._load_started = self._load_started, None
        load.end()
        load.observe(time.monotonic() - started, self._status or 500, self._tokens)

    def _post(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/generate":
            if path == "/healthz":
                self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "method_not_allowed"}, {"Allow": "GET"})
            else:
                self._send_json(HTTPStatus.NOT_FOUND, {"error": "not_found", "path": path})
            return
        try:
            request = validate_generate_request(self._read_json())
        except RequestError as err:
            self._send_error(err)
            return
        generator: Generator = self.server.generator  # type: ignore[attr-defined]
        started = time.perf_counter()
        try:
            text, tokens = generator.complete(**request)
            self._tokens = tokens
        except Exception as exc:  # noqa: BLE001 -- report, keep serving
            self.log_error("generation failed: %r", exc)
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal_error", "reason": str(exc)})
            return
        self._send_json(
            HTTPStatus.OK,
            {
                "text": text,
                "prompt": request["prompt"],
                "max_new_tokens": request["max_new_tokens"],
                "temperature": request["temperature"],
                "checkpoint_step": generator.checkpoint_step,
                "checkpoint": generator.checkpoint,
                "generated_tokens": tokens,
                "latency_s": round(time.perf_counter() - started, 4),
            },
            {"X-Generated-Tokens": str(tokens)},  # read by the serving endpoint's token counter
        )

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Access log to stderr (one line per request)."""
        sys.stderr.write(f"{self.address_string()} - {format % args}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse arguments; ``--checkpoint-dir`` and ``--port`` default to env ``CHECKPOINT_DIR`` / ``PORT``."""
    p = argparse.ArgumentParser(
        description="Serve the GPT checkpoint written by train_gpt.py over HTTP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR") or None,
                   help="directory holding checkpoint.pt (env CHECKPOINT_DIR)")
    p.add_argument("--host", default="0.0.0.0", help="bind address")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8000),
                   help="TCP port, 0 for any free port (env PORT)")
    p.add_argument("--wait-seconds", type=float, default=0.0,
                   help="wait up to this long for the checkpoint file to appear")
    p.add_argument("--checkpoint-uri", default=os.environ.get("CHECKPOINT_URI") or None,
                   help="fsspec URI of a checkpoint store to fetch checkpoint.pt from when the directory lacks it "
                        "(env CHECKPOINT_URI)")
    args = p.parse_args(argv)
    if not args.checkpoint_dir:
        p.error("--checkpoint-dir (or env CHECKPOINT_DIR) is required")
    if not 0 <= args.port <= 65535:
        p.error("--port must be in 0..65535")
    return args


def _writable_directory(directory: str) -> bool:
    """Whether files can be created in ``directory`` (created if missing)."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def store_cache_path(uri: str) -> str:
    """Where a store's checkpoint goes when the checkpoint directory is read-only: under the temp directory."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "checkpoint-store", digest, CHECKPOINT_FILENAME)


def load_generator(checkpoint_dir: str, wait_seconds: float = 0.0, store: CheckpointStore | None = None) -> Generator:
    """Load ``<checkpoint_dir>/checkpoint.pt`` onto CUDA if available, else CPU.

    While the file is missing, fetches it from ``store`` if given (and the
    store has it). Waits up to ``wait_seconds`` for the file to exist; raises
    ``FileNotFoundError`` if it never does, and the store's errors other than
    "not found".
    """
    path = checkpoint_path(checkpoint_dir)
    source = os.path.abspath(path)
    deadline = time.monotonic() + wait_seconds
    while not os.path.exists(path):
        if store is not None:
            target = path if _writable_directory(checkpoint_dir) else store_cache_path(store.uri)
            if store.download(CHECKPOINT_FILENAME, target):
                print(f"fetched checkpoint from {store.url(CHECKPOINT_FILENAME)} to {target}", flush=True)
                path, source = target, store.url(CHECKPOINT_FILENAME)
                break
        if time.monotonic() >= deadline:
            where = f" or {store.url(CHECKPOINT_FILENAME)}" if store is not None else ""
            raise FileNotFoundError(f"no checkpoint at {path}{where}")
        time.sleep(1.0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ckpt = load_checkpoint(path)
    model = model_from_checkpoint(ckpt, device)
    return Generator(model, device, int(ckpt.get("step", 0)), source)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = parse_args(argv)
    try:
        store = CheckpointStore(args.checkpoint_uri) if args.checkpoint_uri else None
        generator = load_generator(args.checkpoint_dir, args.wait_seconds, store)
    except (ImportError, OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"error: cannot load checkpoint: {exc}", file=sys.stderr, flush=True)
        return 2

    server = DrainingServer((args.host, args.port), Handler)
    server.generator = generator  # type: ignore[attr-defined]
    server.load = Load()  # type: ignore[attr-defined]

    def stop(signum: int, _frame: Any) -> None:
        # shutdown() blocks until serve_forever returns, so call it off this thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(
        f"serving on http://{host}:{port} checkpoint_step={generator.checkpoint_step} "
        f"params={generator.model.num_params()} device={generator.device.type}",
        flush=True,
    )
    try:
        server.serve_forever()
        left = server.drain(DRAIN_SECONDS)
    finally:
        server.server_close()
    if left:  # past the drain: end now, as the kill that would follow does (no wait on the threads still working)
        print(f"shut down ({left} request(s) unanswered)", flush=True)
        os._exit(0)
    print("shut down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
