"""Report training progress to the control plane, from any training script (standard library only).

The platform reads two paths (the protocol is specified in ``jobs/efficiency/protocol.py``):

* log lines on stdout, ``step=<int> tokens_per_s=... loss=...`` (and ``final step=...`` at the end), which
  the runner parses from node 0's log;
* Prometheus exposition on ``http://<pod>:$CONTROLPLANE_METRICS_PORT/metrics``, the port the runner declares
  for rank 0 (the local runner: a free port of node 0; Kubernetes: ``K8S_METRICS_PORT``, 9464 by default, the
  container port ``metrics`` of every training pod, which the platform reads through the API server's pod proxy;
  listen on all addresses, as this module does); without that variable no server is started.

Only global rank 0 (env ``RANK``, default 0) reports; on the other ranks every call does nothing. Usage::

    from workload_metrics import WorkloadMetrics   # examples/ on sys.path, or examples.workload_metrics

    metrics = WorkloadMetrics(flops_per_token=model_flops, tokens_per_step=batch * seq_len * world_size)
    for step in range(1, steps + 1):
        ...train...
        if step % 10 == 0:
            metrics.report(step, tokens_per_s=tokens / seconds, loss=loss, step_time_s=seconds / 10)
    metrics.final(steps, tokens_per_s=run_tokens / run_seconds, loss=loss)
    metrics.close()

A workload may add figures of its own (``extra_keys``, e.g. an RL run's mean ``reward``): they are printed on the
same lines and exposed as gauges ``workload_<key>``; the platform ignores them (unknown keys and metric names are
skipped by the protocol's parsers), so they are for people reading the log or their own Prometheus.

``flops_per_token`` is the model FLOPs per training token, ``6N + 12·L·H·Q·T`` (PaLM, Chowdhery et al. 2022,
appendix B: N parameters, L layers, H heads, Q head dimension, T sequence length); the platform divides it by
the accelerator's peak for MFU. Throughputs are over all ranks (global), per second; times in seconds.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TextIO

#: Report key -> (Prometheus metric name, type, help).
METRICS = {
    "step": ("workload_step", "gauge", "Optimizer steps done."),
    "tokens_per_s": ("workload_tokens_per_second", "gauge", "Training tokens per second over all ranks."),
    "samples_per_s": ("workload_samples_per_second", "gauge", "Training sequences per second over all ranks."),
    "step_time_s": ("workload_step_time_seconds", "gauge", "Seconds per optimizer step."),
    "loss": ("workload_loss", "gauge", "Mean training loss over the last interval."),
    "flops_per_token": ("workload_model_flops_per_token", "gauge", "Model FLOPs per training token."),
    "tokens_per_step": ("workload_tokens_per_step", "gauge", "Training tokens per optimizer step, all ranks."),
    "tokens": ("workload_tokens_total", "counter", "Training tokens processed by this run."),
}
KEYS = ("tokens_per_s", "samples_per_s", "step_time_s", "loss", "tokens")
#: What an extra key must look like: a log-line key the protocol's parser reads as a word, a valid metric name.
_EXTRA_KEY = re.compile(r"[a-z][a-z0-9_]*")


def _format(value: float) -> str:
    """An integer as such, a float by its shortest repr (exact round trip)."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    return repr(float(value))


class WorkloadMetrics:
    """The reporter of one training run (see the module docstring).

    ``flops_per_token``/``tokens_per_step``: declared once (also printed, as a ``config`` line); ``port``: the
    exposition port (default env ``CONTROLPLANE_METRICS_PORT``; None or 0: no server); ``log_lines``: print the
    log lines (default True); ``stream``: where they go (stdout); ``rank``: default env ``RANK`` (only 0 reports);
    ``extra_keys``: the workload's own report keys besides :data:`KEYS` (lower-case words; ValueError for one that
    is not, or that is a protocol key).
    """

    def __init__(self, *, flops_per_token: float | None = None, tokens_per_step: int | None = None,
                 port: int | None = None, log_lines: bool = True, stream: TextIO | None = None,
                 rank: int | None = None, extra_keys: tuple[str, ...] = ()):
        for key in extra_keys:
            if not _EXTRA_KEY.fullmatch(key) or key in METRICS or key in ("steps", "mfu"):
                raise ValueError(f"extra key {key!r}: must be a lower-case word that is not a protocol key")
        self.extra_keys = tuple(extra_keys)
        self.enabled = (int(os.environ.get("RANK", "0")) if rank is None else rank) == 0
        self.log_lines = log_lines
        self.stream = stream or sys.stdout
        self.values: dict[str, float] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        if not self.enabled:
            return
        declared = {k: v for k, v in (("flops_per_token", flops_per_token), ("tokens_per_step", tokens_per_step))
                    if v is not None}
        self.values.update(declared)
        if declared and log_lines:
            self._print("config " + " ".join(f"{k}={_format(v)}" for k, v in declared.items()))
        if port is None:
            port = int(os.environ.get("CONTROLPLANE_METRICS_PORT") or 0)
        if port:
            self._serve(port)

    def report(self, step: int, **values: float | None) -> None:
        """A progress report after optimizer step ``step``: ``tokens_per_s``, ``samples_per_s``,
        ``step_time_s``, ``loss``, ``tokens`` and the ``extra_keys`` (any subset; None and non-finite values are left
        out; TypeError for another key)."""
        self._emit("", step, values)

    def final(self, step: int, **values: float | None) -> None:
        """The run's summary at its end (the same keys as :meth:`report`; ``tokens_per_s`` over the whole run)."""
        self._emit("final ", step, values)

    def exposition(self) -> str:
        """The current values in the Prometheus text format (0.0.4)."""
        with self._lock:
            values = dict(self.values)
        lines = []
        for key, (name, kind, help_text) in METRICS.items():
            if key in values:
                family = name[:-len("_total")] if kind == "counter" else name
                lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}", f"{name} {_format(values[key])}"]
        for key in self.extra_keys:
            if key in values:
                name = f"workload_{key}"
                lines += [f"# HELP {name} The workload's own figure {key} (not read by the platform).",
                          f"# TYPE {name} gauge", f"{name} {_format(values[key])}"]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        """Stop the exposition server, if one runs."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _emit(self, prefix: str, step: int, values: dict) -> None:
        if not self.enabled:
            return
        kept = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
        unknown = set(kept) - set(KEYS) - set(self.extra_keys)
        if unknown:
            known = ", ".join(KEYS + self.extra_keys)
            raise TypeError(f"unknown report keys: {', '.join(sorted(unknown))}; known: {known}")
        if not prefix:
            with self._lock:
                self.values.update(kept, step=step)
        if self.log_lines:
            self._print(f"{prefix}step={int(step)} " + " ".join(f"{k}={_format(v)}" for k, v in kept.items()))

    def _print(self, line: str) -> None:
        print(line.rstrip(), file=self.stream, flush=True)

    def _serve(self, port: int) -> None:
        reporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                body = reporter.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # no access log on the training output
                pass

        self._server = ThreadingHTTPServer(("", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="workload-metrics", daemon=True).start()
