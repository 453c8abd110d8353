"""The workload-metrics protocol: how a training job tells the platform its progress, and what the platform keeps.

A job reports through either path (``examples/workload_metrics.py`` implements both for any PyTorch script):

Log lines (stdout of rank 0; the runner reads node 0's log)
    ``step=<int> key=value key=value ...``: a progress report after step ``step``. Keys (all optional but
    ``step``): ``tokens_per_s`` (training tokens per second over all ranks, since the previous report),
    ``samples_per_s`` (sequences per second, idem), ``step_time_s`` (seconds per optimizer step, idem), ``loss``
    (mean training loss over the interval), ``tokens`` (training tokens processed by this run so far),
    ``steps`` (optimizer steps in the interval, when not ``step`` minus the previous report's step).
    ``final step=<int> ...`` (the same keys): the run's own summary at its end; its ``tokens_per_s`` is the run's
    throughput as the workload measured it. Any line may declare ``flops_per_token=<float>`` (model FLOPs per
    training token, PaLM appendix B) and ``tokens_per_step=<int>`` (global tokens per optimizer step), e.g.
    ``config ... flops_per_token=... tokens_per_step=...``. Other words and unknown keys are ignored; a value
    that is not a finite number is ignored. This is what ``examples/train_gpt.py`` prints.

Prometheus exposition (text format 0.0.4), served by rank 0 on the port the runner declares in
``CONTROLPLANE_METRICS_PORT`` (path ``/metrics``; on Kubernetes the container port ``metrics`` of every training
pod, with the ``prometheus.io/scrape``/``port``/``path`` annotations, read from node 0's pod through the API
server's pod proxy; a scrape that fails or answers empty is no report)
    Gauges ``workload_step``, ``workload_tokens_per_second``, ``workload_samples_per_second``,
    ``workload_step_time_seconds``, ``workload_loss``, ``workload_model_flops_per_token``,
    ``workload_tokens_per_step`` and the counter ``workload_tokens_total``, with the meanings above; one scrape
    is one progress report (see :data:`EXPOSITION_KEYS`).

Per attempt the platform keeps a :class:`RunStats`: the last report, the mean over the run and the run's own
summary. Means are step-weighted: throughputs (tokens/s, samples/s) by the harmonic mean, which equals the
tokens (samples) of the reported intervals over their time; loss and step time by the arithmetic mean.
A report whose step is not after the last one kept is a repeat (a log read again, a scrape of an unchanged
gauge) and is not counted twice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Keys of a progress report, with how their mean over the run is taken.
RATE_KEYS = ("tokens_per_s", "samples_per_s")  # step-weighted harmonic mean
LEVEL_KEYS = ("loss", "step_time_s")  # step-weighted arithmetic mean
DECLARED_KEYS = ("flops_per_token", "tokens_per_step")
REPORT_KEYS = ("step", "steps", "tokens") + RATE_KEYS + LEVEL_KEYS + ("mfu",)
#: Prometheus metric name -> report key.
EXPOSITION_KEYS = {
    "workload_step": "step",
    "workload_tokens_per_second": "tokens_per_s",
    "workload_samples_per_second": "samples_per_s",
    "workload_step_time_seconds": "step_time_s",
    "workload_loss": "loss",
    "workload_model_flops_per_token": "flops_per_token",
    "workload_tokens_per_step": "tokens_per_step",
    "workload_tokens": "tokens",  # the counter workload_tokens_total (the parser drops the _total suffix)
    "workload_tokens_total": "tokens",
}
#: Points of the throughput series kept per attempt (halved by dropping every other one when full).
SERIES_MAX_POINTS = 240

_PAIR = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


@dataclass(frozen=True)
class Report:
    """One message of a workload: ``kind`` ``"progress"``, ``"final"`` or ``"declaration"``; ``values`` the
    numbers it carries (report keys and declared keys)."""

    kind: str
    values: Mapping[str, float]


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_line(line: str) -> Report | None:
    """The report of one log line (see the module docstring), or None for a line that carries none."""
    words = line.split(None, 1)
    if not words:
        return None
    pairs = {key: value for key, value in _PAIR.findall(line)}
    values = {k: v for k in REPORT_KEYS + DECLARED_KEYS if k in pairs and (v := _number(pairs[k])) is not None}
    first = words[0]
    step = values.get("step")
    if step is not None and step == int(step) and (first.startswith("step=") or first == "final"):
        return Report("final" if first == "final" else "progress", values)
    declared = {k: values[k] for k in DECLARED_KEYS if k in values}
    return Report("declaration", declared) if declared else None


def parse_log(text: str) -> list[Report]:
    """The reports of ``text`` (a log, or its tail), in order; a trailing line without its newline is left for
    the next read."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines.pop()
    return [report for line in lines if (report := parse_line(line)) is not None]


def parse_exposition(text: str) -> Report | None:
    """The progress report of one scrape of ``/metrics`` (Prometheus text format), or None without
    ``workload_step``. Raises ValueError for text that is not the exposition format."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = EXPOSITION_KEYS.get(sample.name)
            if key is not None and (value := _number(str(sample.value))) is not None:
                values[key] = value
    if "step" not in values or values["step"] != int(values["step"]):
        return None
    return Report("progress", values)


@dataclass
class RunStats:
    """What the platform keeps of one attempt's reports (JSON-ready through :meth:`to_dict`).

    ``last``: the last progress report; ``final``: the run's summary line, if it wrote one; ``first_step``: the
    step of the first report kept; ``weight``: optimizer steps the kept reports cover; ``inverse`` (rate key ->
    sum of steps / rate) and ``weighted`` (level key -> sum of steps x value) give the means; ``declared``:
    ``flops_per_token`` and ``tokens_per_step``; ``series``: ``[seconds since epoch, step, tokens_per_s, loss]``
    points for a chart (at most ``SERIES_MAX_POINTS``).
    """

    reports: int = 0
    first_step: int | None = None
    last: dict[str, float] = field(default_factory=dict)
    final: dict[str, float] | None = None
    weight: float = 0.0
    inverse: dict[str, float] = field(default_factory=dict)
    inverse_weight: dict[str, float] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    weighted_weight: dict[str, float] = field(default_factory=dict)
    declared: dict[str, float] = field(default_factory=dict)
    series: list[list[Any]] = field(default_factory=list)

    @property
    def last_step(self) -> int | None:
        return int(self.last["step"]) if "step" in self.last else None

    def add(self, report: Report, at: float) -> bool:
        """Take ``report`` (received at ``at``, seconds since the epoch); False when it was a repeat.

        A progress report counts when its step is after the last one kept; a summary replaces the previous one;
        declarations update ``declared``.
        """
        values = dict(report.values)
        changed = False
        for key in DECLARED_KEYS:
            if key in values and self.declared.get(key) != values[key]:
                self.declared[key] = values[key]
                changed = True
        if report.kind == "declaration":
            return changed
        if report.kind == "final":
            if self.final != values:
                self.final = values
                return True
            return changed
        step = int(values["step"])
        previous = self.last_step
        if previous is not None and step <= previous:
            return changed
        steps = values.get("steps") or (step - previous if previous is not None else 1)
        for key in RATE_KEYS:
            if values.get(key, 0) > 0:
                self.inverse[key] = self.inverse.get(key, 0.0) + steps / values[key]
                self.inverse_weight[key] = self.inverse_weight.get(key, 0.0) + steps
        for key in LEVEL_KEYS:
            if key in values:
                self.weighted[key] = self.weighted.get(key, 0.0) + steps * values[key]
                self.weighted_weight[key] = self.weighted_weight.get(key, 0.0) + steps
        self.weight += steps
        self.reports += 1
        if self.first_step is None:
            self.first_step = step
        self.last = {k: v for k, v in values.items() if k not in DECLARED_KEYS} | {"step": step}
        self.series.append([round(at, 3), step, values.get("tokens_per_s"), values.get("loss")])
        if len(self.series) > SERIES_MAX_POINTS:
            self.series = self.series[:-1:2] + [self.series[-1]]  # every other point, and the newest
        return True

    def add_all(self, reports: Iterable[Report], at: float) -> bool:
        """:meth:`add` each of ``reports``; True when any changed the stats."""
        changed = False
        for report in reports:
            changed |= self.add(report, at)
        return changed

    def mean(self, key: str) -> float | None:
        """The step-weighted mean of ``key`` over the kept reports (harmonic for rates), None without any."""
        if key in RATE_KEYS:
            inverse = self.inverse.get(key)
            return self.inverse_weight[key] / inverse if inverse else None
        total = self.weighted_weight.get(key)
        return self.weighted[key] / total if total else None

    @property
    def flops_per_token(self) -> float | None:
        return self.declared.get("flops_per_token")

    @property
    def run_tokens_per_s(self) -> float | None:
        """The run's throughput: its own summary's ``tokens_per_s`` if it wrote one, else the mean of the reports."""
        if self.final and self.final.get("tokens_per_s") is not None:
            return self.final["tokens_per_s"]
        return self.mean("tokens_per_s")

    @property
    def tokens(self) -> int | None:
        """Training tokens this run processed: the reported ``tokens`` (summary, else last report), else
        ``tokens_per_step`` x the steps from the first report to the last; None when neither is known."""
        for values in (self.final or {}, self.last):
            if values.get("tokens") is not None:
                return int(values["tokens"])
        per_step = self.declared.get("tokens_per_step")
        if per_step and self.first_step is not None:
            last = int((self.final or {}).get("step") or self.last_step or self.first_step)
            return int(per_step * (last - self.first_step + 1))
        return None

    def to_dict(self) -> dict:
        """A JSON-ready dict; :meth:`from_dict` reads it back."""
        return {"reports": self.reports, "first_step": self.first_step, "last": self.last, "final": self.final,
                "weight": self.weight, "inverse": self.inverse, "inverse_weight": self.inverse_weight,
                "weighted": self.weighted, "weighted_weight": self.weighted_weight, "declared": self.declared,
                "series": self.series}

    @classmethod
    def from_dict(cls, data: Mapping | None) -> RunStats:
        """The stats stored by :meth:`to_dict` (empty stats for None or ``{}``)."""
        data = dict(data or {})
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def last_throughput(reports: Iterable[Report]) -> dict | None:
    """The last of ``reports`` (in log order) that carries ``tokens_per_s``, as one pod's kept throughput:
    ``{"step", "tokens_per_s", "samples_per_s" (or None), "final" (whether it is the run's summary)}``; None when
    none carries it. What a multi-role job shows per pod (``jobs.roles``)."""
    found = None
    for report in reports:
        if report.kind != "declaration" and report.values.get("tokens_per_s") is not None:
            found = report
    if found is None:
        return None
    return {"step": int(found.values["step"]), "tokens_per_s": found.values["tokens_per_s"],
            "samples_per_s": found.values.get("samples_per_s"), "final": found.kind == "final"}


def later_throughput(kept: Mapping | None, found: Mapping | None) -> bool:
    """Whether ``found`` (``last_throughput``) is later than ``kept``, a pod's throughput kept before: a later step,
    or the same step's summary over its progress report. A read of an older tail never moves it back."""
    if found is None:
        return False
    if kept is None:
        return True
    return (found["step"], found["final"]) > (kept["step"], kept["final"])
