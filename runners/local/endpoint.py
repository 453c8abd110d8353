"""The endpoint of a serving job on the local runner: one address that balances requests over the ready replicas.

Started by ``runners.local.runner`` in a session of its own, once per serving job (not per attempt), so its
address stays the same for the life of the job::

    python -m runners.local.endpoint --dir DIR --port P --admin-port A [--idle-exit S] [--check-interval S]

``DIR`` (``<LOCAL_RUNNER_DIR>/job-<id>/endpoint``) holds ``backends.json``, which the runner rewrites whenever
the job's replicas change: ``{"replicas": ["127.0.0.1:<port>", ...], "health_path": "/healthz"}``. The proxy
reads it again when it changes and checks every replica's health path every ``--check-interval`` seconds
(a 2xx or 3xx answer within 1 s: ready; Kubernetes' httpGet readiness probe counts the same answers as success).
Requests go round-robin to the ready replicas only, so a starting or failing replica gets none. A replica that
refuses the connection is taken out of rotation until its next good check, and the request goes to another one
(it never reached a server, so any method may be sent again); a replica that fails after the request was sent
(the connection broke, no answer) is tried again on another replica only for an idempotent request: a method
RFC 9110 section 9.2.2 calls idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or a request with an
``Idempotency-Key`` header (IETF draft "The Idempotency-Key HTTP Header Field"). Without a ready replica the
answer is ``503`` with ``Retry-After: 1``, unless ``backends.json`` has ``hold_seconds`` (a job scaled to zero:
``{"hold_seconds": 120, "refusal": ""}``): the request is then held, counted in flight (which is what makes the
autoscaler admit a replica), until a replica is ready (sent there), ``hold_seconds`` pass (503,
``no_ready_replica``) or the control plane writes a ``refusal`` (503, ``scale_from_zero_refused``, with the reason;
later requests get it at once while it stays). Answers carry ``X-Controlplane-Replica``: the replica that served.

``--admin-port`` serves ``GET /metrics`` (Prometheus exposition) with the endpoint's own counters, which the
autoscaler reads (``jobs.serving``): ``controlplane_endpoint_requests_total``, ``..._in_flight``,
``..._in_flight_seconds_total`` (the integral of requests in flight over time: its increase over an interval
divided by the interval is the mean number in flight), ``..._clock_seconds`` (the proxy's monotonic clock, for
those intervals), ``..._failed_requests_total`` (answered 502 or 503 by the proxy itself), ``..._retries_total``,
``..._ready_replicas``, ``..._replicas`` and ``..._replica_requests_total{replica}``; for the service's figures
(``jobs.serving_figures``), ``..._request_duration_seconds`` (a Prometheus histogram of the seconds from a request's
arrival to its answer, cumulative ``_bucket{le}`` counts, ``_sum``, ``_count``; ``LATENCY_BUCKETS``),
``..._errors_total`` (answers with a 5xx status: a replica's, or the proxy's own 502/503) and
``..._generated_tokens_total`` (the sum of the ``X-Generated-Tokens`` header of the answers that carry one:
``examples/serve.py`` says there how many tokens it generated).

With no replica ready for ``--idle-exit`` seconds (the job's attempt ended and no other took its place, or every
replica is down; never while it holds requests for a job scaled to zero) or its directory gone, the proxy exits 0 (the runner's next look at a live attempt starts it
again, on the same port); on SIGTERM or SIGINT too. Built on aiohttp's server and client (aio-libs); no Django.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import signal
import sys
import time
from pathlib import Path

from aiohttp import ClientConnectorError, ClientError, ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

BACKENDS_FILE = "backends.json"
#: Headers that belong to one connection (RFC 9110 section 7.6.1), not forwarded; and those aiohttp sets itself.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length"})
#: Methods RFC 9110 section 9.2.2 defines as idempotent: sent again after a failure, the effect is the same.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
IDEMPOTENCY_KEY = "Idempotency-Key"
REPLICA_HEADER = "X-Controlplane-Replica"
#: The header a replica names the tokens it generated for an answer with (``examples/serve.py``).
TOKENS_HEADER = "X-Generated-Tokens"
#: Upper bounds (seconds) of the latency histogram's buckets: prometheus_client's default buckets (client_python,
#: ``Histogram.DEFAULT_BUCKETS``, 5 ms to 10 s) and 30, 60, 120 and 300 s for long generations, up to the default
#: request timeout; ``+Inf`` is added when shown.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
                   120.0, 300.0)
#: Seconds a health check may take before the replica counts as not ready.
HEALTH_TIMEOUT_SECONDS = 1.0
#: Seconds between looks for a ready replica while a request is held (a job scaled to zero).
HOLD_POLL_SECONDS = 0.1
#: The largest request body forwarded, bytes.
MAX_BODY_BYTES = 16 * 1024 * 1024


def idempotent(method: str, headers) -> bool:
    """Whether a request of ``method`` with ``headers`` may be sent again to another replica after a failure that
    happened once it was sent: an RFC 9110 idempotent method, or an ``Idempotency-Key`` header."""
    return method.upper() in IDEMPOTENT_METHODS or IDEMPOTENCY_KEY in headers


class Replicas:
    """The replicas of the job as ``backends.json`` lists them, which of them are ready, and the round-robin turn."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.addresses: list[str] = []
        self.health_path = "/healthz"
        self.ready: set[str] = set()
        self.hold_seconds = 0.0
        self.refusal = ""
        self.served: dict[str, int] = {}
        self._turn = 0
        self._stamp: tuple[int, int] | None = None
        self.idle_since = time.monotonic()

    def reload(self) -> None:
        """Read ``backends.json`` again if it changed (size and mtime); a replica no longer listed leaves rotation."""
        path = self.directory / BACKENDS_FILE
        try:
            stat = path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp == self._stamp:
                return
            data = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            return
        self._stamp = stamp
        self.addresses = [a for a in data.get("replicas") or () if isinstance(a, str)]
        self.health_path = data.get("health_path") or "/healthz"
        self.hold_seconds = float(data.get("hold_seconds") or 0)
        self.refusal = str(data.get("refusal") or "")
        self.ready &= set(self.addresses)

    def idle_for(self) -> float:
        """Seconds since a replica was last ready (0 while one is)."""
        if self.ready:
            self.idle_since = time.monotonic()
        return time.monotonic() - self.idle_since

    def pick(self, exclude: set[str]) -> str | None:
        """The next ready replica in round-robin order, not in ``exclude``; None when there is none."""
        candidates = [a for a in self.addresses if a in self.ready and a not in exclude]
        if not candidates:
            return None
        self._turn += 1
        return candidates[self._turn % len(candidates)]

    def mark_down(self, address: str) -> None:
        """Take ``address`` out of rotation until its next good health check."""
        self.ready.discard(address)


class Endpoint:
    """The proxy's state: the replicas, the HTTP client, and the counters ``/metrics`` shows."""

    def __init__(self, directory: Path, request_timeout: float):
        self.replicas = Replicas(directory)
        self.request_timeout = request_timeout
        self.session: ClientSession | None = None
        self.requests = 0
        self.failed = 0
        self.retries = 0
        self.in_flight = 0
        self._area = 0.0  # requests in flight integrated over seconds
        self._area_at = time.monotonic()
        self.errors = 0
        self.tokens = 0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, not cumulative; the last is +Inf
        self.latency_sum = 0.0

    def _in_flight_changes(self, by: int) -> None:
        now = time.monotonic()
        self._area += self.in_flight * (now - self._area_at)
        self._area_at = now
        self.in_flight += by

    def in_flight_seconds(self) -> float:
        """The integral of requests in flight over time up to now, request-seconds."""
        return self._area + self.in_flight * (time.monotonic() - self._area_at)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Forward ``request`` to a ready replica (see the module docstring for which, and when another is tried)."""
        self.requests += 1
        self._in_flight_changes(+1)
        started = time.monotonic()
        status = 500  # an exception the server turns into a 500
        try:
            answer = await self._forward(request)
            status = answer.status
            self._count_tokens(answer)
            return answer
        except asyncio.CancelledError:
            status = 499  # the client went away (nginx's "client closed request"): no error of the service
            raise
        finally:
            self._in_flight_changes(-1)
            self.observe(time.monotonic() - started, status)

    def observe(self, seconds: float, status: int) -> None:
        """Count one answer of ``status`` given ``seconds`` after its request arrived: the latency histogram, and an
        error for a 5xx."""
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds
        if status >= 500:
            self.errors += 1

    def _count_tokens(self, answer: web.StreamResponse) -> None:
        value = answer.headers.get(TOKENS_HEADER, "")
        if value.isdigit():
            self.tokens += int(value)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        again = idempotent(request.method, request.headers)
        tried: set[str] = set()
        self.replicas.reload()  # one stat: a replica retired a moment ago gets no new request
        while True:
            address = self.replicas.pick(tried)
            if address is None and not tried and self.replicas.hold_seconds:
                address = await self._held()
                if address is None:
                    self.failed += 1
                    return self._not_held()
            if address is None:
                self.failed += 1
                status = 502 if tried else 503
                error = "replica_failed" if tried else "no_ready_replica"
                return web.json_response({"error": error, "tried": sorted(tried)}, status=status,
                                         headers={"Retry-After": "1"})
            if tried:
                self.retries += 1
            tried.add(address)
            try:
                async with self.session.request(request.method, f"http://{address}{request.rel_url}",
                                                headers=headers, data=body, allow_redirects=False) as answer:
                    payload = await answer.read()
                    out = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP
                           and k.lower() != "content-encoding"}
                    out[REPLICA_HEADER] = address
                    self.replicas.served[address] = self.replicas.served.get(address, 0) + 1
                    return web.Response(status=answer.status, body=payload, headers=out)
            except ClientConnectorError:
                self.replicas.mark_down(address)  # never reached a server: any method may go elsewhere
            except (ClientError, asyncio.TimeoutError):
                self.replicas.mark_down(address)
                if not again:
                    self.failed += 1
                    return web.json_response({"error": "replica_failed", "replica": address}, status=502)

    async def _held(self) -> str | None:
        """Hold a request of a job scaled to zero until a replica is ready (its address), ``hold_seconds`` pass or
        a refusal is written (None)."""
        deadline = time.monotonic() + self.replicas.hold_seconds
        while not self.replicas.refusal and time.monotonic() < deadline:
            await asyncio.sleep(HOLD_POLL_SECONDS)
            self.replicas.reload()
            address = self.replicas.pick(set())
            if address is not None:
                return address
        return None

    def _not_held(self) -> web.Response:
        """The 503 of a held request that no replica took: the refusal's reason, or the hold's end."""
        if self.replicas.refusal:
            return web.json_response({"error": "scale_from_zero_refused", "reason": self.replicas.refusal},
                                     status=503, headers={"Retry-After": "15"})
        return web.json_response({"error": "no_ready_replica", "held_seconds": self.replicas.hold_seconds},
                                 status=503, headers={"Retry-After": "1"})

    async def check(self, address: str) -> None:
        """One readiness check of ``address``: GET its health path; 2xx or 3xx within the timeout is ready."""
        try:
            async with self.session.get(f"http://{address}{self.replicas.health_path}", allow_redirects=False,
                                        timeout=ClientTimeout(total=HEALTH_TIMEOUT_SECONDS)) as answer:
                await answer.read()
                ok = 200 <= answer.status < 400
        except (ClientError, asyncio.TimeoutError, OSError):
            ok = False
        if ok and address in self.replicas.addresses:
            self.replicas.ready.add(address)
        elif not ok:
            self.replicas.ready.discard(address)

    async def check_loop(self, interval: float, idle_exit: float, stop: asyncio.Event) -> None:
        """Reload the replicas and check each one every ``interval`` seconds; set ``stop`` once none has been
        ready for ``idle_exit`` seconds, or the directory is gone."""
        while not stop.is_set():
            if not self.replicas.directory.is_dir():
                stop.set()  # the job's files are gone
                return
            self.replicas.reload()
            if self.replicas.addresses:
                await asyncio.gather(*(self.check(a) for a in list(self.replicas.addresses)))
            if self.replicas.idle_for() >= idle_exit and not self.replicas.hold_seconds:
                stop.set()
                return
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass

    def collect(self):
        """The endpoint's metrics (a prometheus_client collector)."""
        yield CounterMetricFamily("controlplane_endpoint_requests", "Requests the endpoint received",
                                  value=self.requests)
        yield CounterMetricFamily("controlplane_endpoint_failed_requests",
                                  "Requests the endpoint answered 502 or 503 itself", value=self.failed)
        yield CounterMetricFamily("controlplane_endpoint_retries", "Requests sent again to another replica",
                                  value=self.retries)
        yield GaugeMetricFamily("controlplane_endpoint_in_flight", "Requests in flight now", value=self.in_flight)
        yield CounterMetricFamily("controlplane_endpoint_in_flight_seconds",
                                  "Requests in flight integrated over time, request-seconds",
                                  value=self.in_flight_seconds())
        yield GaugeMetricFamily("controlplane_endpoint_clock_seconds", "The endpoint's monotonic clock, seconds",
                                value=time.monotonic())
        yield GaugeMetricFamily("controlplane_endpoint_replicas", "Replicas listed", value=len(self.replicas.addresses))
        yield GaugeMetricFamily("controlplane_endpoint_ready_replicas", "Replicas ready (their health check passed)",
                                value=len(self.replicas.ready))
        yield CounterMetricFamily("controlplane_endpoint_errors", "Answers with a 5xx status (a replica's or the "
                                  "endpoint's own)", value=self.errors)
        yield CounterMetricFamily("controlplane_endpoint_generated_tokens",
                                  f"Tokens the replicas said they generated ({TOKENS_HEADER})", value=self.tokens)
        cumulative, buckets = 0, []
        for bound, count in zip((*LATENCY_BUCKETS, float("inf")), self.latency_counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        yield HistogramMetricFamily("controlplane_endpoint_request_duration_seconds",
                                    "Seconds from a request's arrival to its answer", buckets=buckets,
                                    sum_value=self.latency_sum)
        served = CounterMetricFamily("controlplane_endpoint_replica_requests", "Requests each replica answered",
                                     labels=["replica"])
        for address, count in sorted(self.replicas.served.items()):
            served.add_metric([address], count)
        yield served


async def serve(directory: Path, port: int, admin_port: int, idle_exit: float, check_interval: float,
                request_timeout: float) -> int:
    """Run the endpoint until SIGTERM/SIGINT or ``idle_exit`` seconds without replicas; returns the exit status."""
    endpoint = Endpoint(directory, request_timeout)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(endpoint)
    endpoint.session = ClientSession(timeout=ClientTimeout(total=request_timeout), auto_decompress=False)

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/{tail:.*}", endpoint.handle)
    admin = web.Application()
    admin.router.add_get("/metrics", metrics)
    runners = [web.AppRunner(app, access_log=None), web.AppRunner(admin, access_log=None)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for runner, at in zip(runners, (port, admin_port), strict=True):
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", at).start()
        print(f"endpoint on http://127.0.0.1:{port} (metrics on :{admin_port}/metrics)", flush=True)
        await endpoint.check_loop(check_interval, idle_exit, stop)
    finally:
        for runner in runners:
            await runner.cleanup()
        await endpoint.session.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve the endpoint of the command line; returns the process exit status."""
    p = argparse.ArgumentParser(prog="python -m runners.local.endpoint", description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, type=Path, help="the directory holding backends.json")
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--admin-port", required=True, type=int)
    p.add_argument("--idle-exit", type=float, default=60.0, help="seconds without a ready replica before exiting")
    p.add_argument("--check-interval", type=float, default=0.5, help="seconds between readiness checks")
    p.add_argument("--request-timeout", type=float, default=300.0, help="seconds a forwarded request may take")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(serve(args.dir, args.port, args.admin_port, args.idle_exit, args.check_interval,
                             args.request_timeout))


if __name__ == "__main__":
    sys.exit(main())
