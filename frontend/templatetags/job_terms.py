"""``{% load job_terms %}``: ``{{ seconds|duration }}``, a length of time as a person reads it; ``{{ job|job_size }}``,
what a job holds (GPUs, or for a CPU-only job vCPUs and GiB; a multi-role job its roles summed);
``{{ event|timeline_sentence }}``, a timeline line as a sentence."""

from __future__ import annotations

from decimal import Decimal

from django import template

from core.gpus import exact_gpus
from jobs.preview import stored_job_asks

register = template.Library()


@register.filter
def duration(seconds) -> str:
    """``seconds`` (a number of seconds, at least 0) as ``2 d 3 h``, ``1 h 05 min``, ``4 min 09 s`` or ``12 s``
    (the two largest units, the rest truncated); None: ``—`` (it never started)."""
    if seconds is None or seconds == "":
        return "—"
    total = max(int(seconds), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def number(value) -> str:
    """A Decimal count without trailing zeros: ``Decimal("2.000")`` -> ``"2"``, ``Decimal("0.5")`` -> ``"0.5"``."""
    return format(Decimal(str(value)).normalize(), "f")


@register.filter
def job_size(job) -> str:
    """What ``job`` (a ``Job``) holds, for lists: ``2 × H100-80GB``; a share of one GPU ``0.25 of 1 × H100-80GB``
    (``Job.gpu_share_milli``), a MIG instance ``1 × A100-80GB MIG 1g.10gb``; for a CPU-only job ``2 vCPUs, 4 GiB``."""
    if job.mig_profile:
        return f"1 × {job.accelerator.name} MIG {job.mig_profile}"
    if job.gpu_share_milli:
        return f"{number(exact_gpus(job.gpu_share_milli))} of 1 × {job.accelerator.name}"
    asks = stored_job_asks(job)
    if asks["gpus"] or not (asks["vcpus"] or asks["gib"]):
        return f"{asks['gpus']} × {job.accelerator.name}"
    vcpus = number(asks["vcpus"])
    return f"{vcpus} vCPU{'' if vcpus == '1' else 's'}, {number(asks['gib'])} GiB"


@register.filter
def attempt_gpus(attempt, job) -> str:
    """What one attempt (a ``JobAttempt`` of ``job``) held, for the job page's attempt rows: its GPUs (``2``); for
    a share of one GPU the share and, once booked, the GPU of its node (``0.25 of GPU 3``, ``placement["gpu"]``);
    for a MIG instance its profile (``MIG 1g.10gb``)."""
    if job.mig_profile:
        return f"MIG {job.mig_profile}"
    if job.gpu_share_milli:
        gpu = (attempt.placement or {}).get("gpu")
        share = number(exact_gpus(job.gpu_share_milli))
        return f"{share} of GPU {gpu}" if gpu is not None else f"{share} of 1 GPU"
    return str(attempt.gpus)


@register.filter
def timeline_sentence(event) -> str:
    """A job event's reason (``JobEvent``) as a sentence: first letter capitalized, ``— by <username>`` when the
    actor is not named in it already, a full stop at the end (``all nodes running`` -> ``All nodes running.``);
    empty when it has no reason."""
    text = (event.reason or "").strip()
    if not text:
        return ""
    actor = getattr(event.actor, "username", "") if event.actor_id else ""
    if actor and actor not in text:
        text += f" — by {actor}"
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


@register.filter
def kind_said(event) -> bool:
    """Whether a job event's reason begins with its kind (``submitted``: "submitted by alice"), so the timeline need
    not show the kind before it."""
    return bool(event.kind) and (event.reason or "").strip().lower().startswith(event.kind.lower())
