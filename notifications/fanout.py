"""The fan-out: notifications derived from job events and budget alerts, once per (event, subscription).

Each pass reads the rows of a source (``jobs.JobEvent``, ``costs.BudgetAlert``) after its cursor
(``FanoutCursor``), in id order, and inserts one ``Notification`` per matching subscription with
``ON CONFLICT DO NOTHING`` on the unique (subscription, source, source id) key. The cursor moves only over rows at
least ``NOTIFY_SETTLE_SECONDS`` old: a transaction still open when a later row committed has a lower id than it,
and is read by a later pass as long as it commits within that time; rows read twice meanwhile create nothing
twice. The pass holds its cursor row locked (``SELECT ... FOR UPDATE``), so two passes (beat's and a task
delivered twice) run one after the other. Nothing here sends: ``notifications.delivery`` does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from core.money import shown_usd, usd_cents
from costs.models import BudgetAlert
from costs.unknown import unpriced_hours
from jobs.models import FINAL_STATES, JobAttempt, JobEvent, JobState
from quotas.models import Membership

from .models import Event, FanoutCursor, Notification, Subscription

#: The job states whose events may notify: the three ends, RECOVERING (a preemption) and RUNNING (a recovery).
NOTIFYING_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.RECOVERING, JobState.RUNNING)
#: Attempt ends that make an entry into RECOVERING a preemption: the scheduler's, and the provider's spot reclaim.
PREEMPTION_END_REASONS = (JobAttempt.EndReason.PREEMPTED, JobAttempt.EndReason.SPOT_RECLAIMED)
#: Rows of a source read per pass at most; the cursor stops at the last one read, and the next pass goes on.
BATCH = 1000
FINAL_EVENTS = {JobState.SUCCEEDED: Event.JOB_SUCCEEDED, JobState.FAILED: Event.JOB_FAILED,
                JobState.CANCELLED: Event.JOB_CANCELLED}


def job_event_kind(event: JobEvent) -> str | None:
    """The ``Event`` a job's state change is, or None when it notifies nobody.

    SUCCEEDED, FAILED, CANCELLED: the job ended. RECOVERING after an attempt ended as Preempted or SpotReclaimed
    (``data["end_reason"]``, written with the change): a preemption. RUNNING of an attempt numbered 2 or more: the
    job runs again after an earlier attempt ended, a recovery.
    """
    if event.to_state in FINAL_EVENTS:
        return FINAL_EVENTS[event.to_state]
    if event.to_state == JobState.RECOVERING and (event.data or {}).get("end_reason") in PREEMPTION_END_REASONS:
        return Event.JOB_PREEMPTED
    if event.to_state == JobState.RUNNING and event.attempt is not None and event.attempt.number > 1:
        return Event.JOB_RECOVERED
    return None


@dataclasses.dataclass
class Audience:
    """The active subscriptions of one pass: team ones by team id, personal ones with their users' team ids."""

    by_team: dict[int, list[Subscription]]
    personal_by_team: dict[int, list[Subscription]]
    earliest: dt.datetime | None = None

    @classmethod
    def load(cls) -> "Audience":
        """Two queries: the active subscriptions, and the memberships of the users of the personal ones."""
        by_team, personal_by_team = defaultdict(list), defaultdict(list)
        personal = defaultdict(list)
        earliest = None
        for sub in Subscription.objects.filter(active=True).select_related("user"):
            earliest = sub.created_at if earliest is None else min(earliest, sub.created_at)
            if sub.team_id is not None:
                by_team[sub.team_id].append(sub)
            else:
                personal[sub.user_id].append(sub)
        for user_id, team_id in Membership.objects.filter(user_id__in=list(personal)).values_list("user_id",
                                                                                                    "team_id"):
            personal_by_team[team_id].extend(personal[user_id])
        return cls(by_team, personal_by_team, earliest)

    @property
    def team_ids(self) -> set[int]:
        return set(self.by_team) | set(self.personal_by_team)

    def for_event(self, team_id: int, kind: str, at: dt.datetime, submitter_id: int | None = None):
        """The subscriptions of ``team_id`` that asked for ``kind`` and existed at ``at``; a personal one with
        ``only_own_jobs`` only for a job ``submitter_id`` is its user."""
        for sub in self.by_team.get(team_id, []) + self.personal_by_team.get(team_id, []):
            if kind not in sub.events or sub.created_at > at:
                continue
            if sub.only_own_jobs and kind.startswith("job.") and sub.user_id != submitter_id:
                continue
            yield sub


def recipient(sub: Subscription) -> str:
    """The address of an e-mail subscription: its own, else (a personal one) its user's; "" for a webhook."""
    if sub.channel != Subscription.Channel.EMAIL:
        return ""
    return sub.email or (sub.user.email if sub.user_id else "")


def notification(sub: Subscription, source: str, source_id: int, kind: str, team_id: int, subject: str,
                 payload: dict, now: dt.datetime, job_id: int | None = None) -> Notification:
    """The unsaved row for ``sub``: pending and due now, or failed at once when an e-mail has no address."""
    address = recipient(sub)
    missing = sub.channel == Subscription.Channel.EMAIL and not address
    return Notification(subscription=sub, source=source, source_id=source_id, event=kind, team_id=team_id,
                        job_id=job_id, recipient=address, subject=subject[:200], payload=payload, next_attempt_at=now,
                        status=Notification.Status.FAILED if missing else Notification.Status.PENDING,
                        last_error="no e-mail address to send to" if missing else "")


def absolute(path: str) -> str | None:
    """``path`` under ``NOTIFY_BASE_URL`` (the UI's public address, e.g. ``https://cp.example.com``); None when
    that setting is empty: a path alone is no link a chat tool or a mail reader can follow."""
    base = settings.NOTIFY_BASE_URL.rstrip("/")
    return base + path if base else None


def link_words(url: str | None) -> str:
    """The closing words of a message's text: `` <url>`` when there is a link, else a note that the setting that
    makes one is missing."""
    return f" {url}" if url else " (no link: NOTIFY_BASE_URL is not set)"


def job_message(event: JobEvent, kind: str) -> tuple[str, dict]:
    """The subject and the Slack-compatible body of a job event: ``text`` for people, then the fields for
    programs (``event``, ``occurred_at``, ``team``, ``job_id``, ``job_name``, ``state``, ``reason``, ``cost_usd``:
    the job's accrued cost so far as its page and the API show it (``core.money.shown_usd``: USD rounded to cents,
    null when none of it is priced; "Cost" once the job ended, "Cost so far" before), ``unpriced_gpu_hours`` and
    ``unpriced_vcpu_hours`` beside it, ``url``: its page, null when ``NOTIFY_BASE_URL`` is empty). Class: unknown money shown as $0; invariant: a money figure is the same on every surface, and never 0
    where its price is unknown."""
    job = event.job
    words = {Event.JOB_SUCCEEDED: "succeeded", Event.JOB_FAILED: "failed", Event.JOB_CANCELLED: "was cancelled",
             Event.JOB_PREEMPTED: "was preempted", Event.JOB_RECOVERED: "is running again"}[kind]
    url = absolute(f"/jobs/{job.pk}/")
    gpu_hours, vcpu_hours = unpriced_hours(job=job)
    cost = shown_usd(job.accrued_cost_usd, gpu_hours + vcpu_hours)
    subject = f"[controlplane] {job.team.slug}: job {job.pk} {job.name} {words}"
    text = f"Job {job.pk} {job.name} of team {job.team.slug} {words}"
    text += f": {event.reason}." if event.reason else "."
    text += (" Cost: " if event.to_state in FINAL_STATES else " Cost so far: ") + (
        "unknown" if cost is None else f"${cost}")
    if gpu_hours or vcpu_hours:
        text += f" (and {gpu_hours:g} GPU-hours, {vcpu_hours:g} vCPU-hours without a price)"
    text += "." + link_words(url)
    return subject, {"text": text, "event": kind, "occurred_at": event.created_at.isoformat(), "team": job.team.slug,
                     "job_id": job.pk, "job_name": job.name, "state": event.to_state, "reason": event.reason,
                     "cost_usd": cost, "unpriced_gpu_hours": gpu_hours, "unpriced_vcpu_hours": vcpu_hours,
                     "url": url}


def budget_message(alert: BudgetAlert) -> tuple[str, dict]:
    """The subject and the Slack-compatible body of a budget threshold crossed (``event``, ``occurred_at``,
    ``team``, ``budget_id``, ``threshold_percent``, ``spent_usd`` and ``amount_usd`` in USD rounded to cents,
    ``period_start``, ``url``: the team's page, null when ``NOTIFY_BASE_URL`` is empty)."""
    budget = alert.budget
    team = budget.team.slug
    url = absolute(f"/teams/{team}/")
    spent, amount = usd_cents(alert.spent_usd), usd_cents(alert.amount_usd)
    subject = f"[controlplane] {team}: {alert.threshold_percent}% of the {budget.period} budget reached"
    text = (f"Team {team} reached {alert.threshold_percent}% of its {budget.period} budget: ${spent} of ${amount} "
            f"spent in the period from {alert.period_start:%Y-%m-%d}." + link_words(url))
    return subject, {"text": text, "event": Event.BUDGET_THRESHOLD.value, "occurred_at": alert.fired_at.isoformat(),
                     "team": team, "budget_id": budget.pk, "threshold_percent": alert.threshold_percent,
                     "spent_usd": spent, "amount_usd": amount, "period_start": alert.period_start.isoformat(),
                     "url": url}


def _job_rows(event: JobEvent, audience: Audience, now: dt.datetime) -> list[Notification]:
    kind = job_event_kind(event)
    if kind is None:
        return []
    subs = list(audience.for_event(event.job.team_id, kind, event.created_at, event.job.submitter_id))
    if not subs:
        return []
    subject, payload = job_message(event, kind)
    return [notification(s, Notification.Source.JOB_EVENT, event.pk, kind, event.job.team_id, subject, payload, now,
                         job_id=event.job_id) for s in subs]


def _budget_rows(alert: BudgetAlert, audience: Audience, now: dt.datetime) -> list[Notification]:
    subs = list(audience.for_event(alert.budget.team_id, Event.BUDGET_THRESHOLD, alert.fired_at))
    if not subs:
        return []
    subject, payload = budget_message(alert)
    return [notification(s, Notification.Source.BUDGET_ALERT, alert.pk, Event.BUDGET_THRESHOLD,
                         alert.budget.team_id, subject, payload, now) for s in subs]


SOURCES = {
    Notification.Source.JOB_EVENT: (JobEvent, "created_at", "job__team_id", _job_rows,
                                    lambda qs: qs.filter(to_state__in=NOTIFYING_STATES).select_related(
                                        "job__team", "attempt")),
    Notification.Source.BUDGET_ALERT: (BudgetAlert, "fired_at", "budget__team_id", _budget_rows,
                                       lambda qs: qs.select_related("budget__team")),
}


def fan_out_source(source: str, audience: Audience, now: dt.datetime, batch: int = BATCH) -> int:
    """One pass over ``source``'s rows after its cursor (module docstring); returns the notifications inserted.

    Reads at most ``batch`` rows that may notify (the events of the teams someone subscribed to) and moves the
    cursor to the highest id below which every row is settled and read.
    """
    model, time_field, team_field, rows_of, narrow = SOURCES[source]
    settled = now - dt.timedelta(seconds=settings.NOTIFY_SETTLE_SECONDS)
    with transaction.atomic():
        # One read locks the cursor on every pass but the first (no row yet).
        cursor = FanoutCursor.objects.select_for_update().filter(source=source).first()
        if cursor is None:
            # The first pass starts after the rows that can notify nobody: settled, and older than every
            # subscription (one scan, once), so an install with a long history does not read it all again.
            floor = min(settled, audience.earliest or settled)
            start = model.objects.filter(**{f"{time_field}__lt": floor}).aggregate(m=Max("id"))["m"] or 0
            FanoutCursor.objects.get_or_create(source=source, defaults={"last_id": start})
            cursor = FanoutCursor.objects.select_for_update().get(source=source)
        after = model.objects.filter(id__gt=cursor.last_id)
        if not after.exists():
            return 0  # no row after the cursor: nothing to read, and the cursor stays where it is
        rows = list(narrow(after.filter(**{f"{team_field}__in": audience.team_ids})).order_by("id")[:batch]) \
            if audience.team_ids else []
        made = [n for row in rows for n in rows_of(row, audience, now)]
        Notification.objects.bulk_create(made, ignore_conflicts=True)
        upper = after.filter(**{f"{time_field}__lte": settled}).aggregate(m=Max("id"))["m"] or cursor.last_id
        unsettled = [r.id for r in rows if getattr(r, time_field) > settled]
        if unsettled:
            upper = min(upper, unsettled[0] - 1)
        if len(rows) == batch:
            upper = min(upper, rows[-1].id)
        if upper > cursor.last_id:
            FanoutCursor.objects.filter(source=source).update(last_id=upper, updated_at=now)
    return len(made)


def fan_out(now: dt.datetime | None = None) -> int:
    """One pass over every source (job events, budget alerts) at ``now`` (default now, aware UTC); returns the
    notifications it tried to insert (those already there are left as they are)."""
    now = now or timezone.now()
    audience = Audience.load()
    return sum(fan_out_source(source, audience, now) for source in SOURCES)
