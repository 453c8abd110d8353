"""The simulated Celery side: the broker is Celery's in-memory transport, beat publishes on the virtual clock, and
the worker delivers the messages one at a time, in the scenario's order, at least once.

Nothing of Celery is faked: the platform publishes with ``apply_async`` as in production (routes, countdowns of
retries), and a delivered task runs its real body with a worker's request context, so ``self.retry`` and
``autoretry_for`` publish the retry with its countdown (its ``eta``), which this worker holds until the virtual
clock reaches it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import traceback

from celery import current_app
from celery.exceptions import Retry
from django.conf import settings
from django.db import close_old_connections, connection


@dataclasses.dataclass
class Message:
    """One published task: its name, arguments, the earliest virtual time it may run (``eta``, None: now), its
    retry count, and the order of publication (``serial``)."""

    serial: int
    task: str
    args: list
    kwargs: dict
    eta: dt.datetime | None
    retries: int
    queue: str

    def label(self) -> str:
        args = ",".join(map(str, self.args))
        return f"{self.task.rsplit('.', 1)[-1]}({args})"


@dataclasses.dataclass
class Delivery:
    """What happened to one delivery: the message, ``outcome`` (``ok``, ``retry``, ``error``) and, for an error,
    the traceback's last lines."""

    message: Message
    outcome: str
    error: str = ""


class SimulatedWorker:
    """The broker's queues read into ``pending`` and delivered on demand.

    ``collect()`` moves what the platform published since into ``pending`` (in publication order); ``due(now)``
    lists the messages whose eta has come; ``deliver(message)`` runs it as a worker would; ``beat(now)`` publishes the periodic tasks that are due.
    """

    def __init__(self, beat_schedule: dict | None = None):
        from jobs.scheduling.pacing import SCHEDULE_TASK, registered_task

        registered_task(SCHEDULE_TASK)  # every app's tasks registered
        self.app = current_app._get_current_object()
        self.pending: list[Message] = []
        self.serial = itertools.count()
        self.deliveries = 0
        self.errors: list[Delivery] = []
        schedule = settings.CELERY_BEAT_SCHEDULE if beat_schedule is None else beat_schedule
        self.beat_every = {entry["task"]: float(entry["schedule"]) for entry in schedule.values()}
        self.beat_next: dict[str, dt.datetime] = {}
        self._connection = self._channel = None
        self.queues = sorted({settings.CELERY_FAST_QUEUE, settings.CELERY_SLOW_QUEUE, "celery"})

    def purge(self) -> None:
        """Drop every message in the broker and in ``pending`` (a new scenario)."""
        self.collect()
        self.pending.clear()
        self.beat_next.clear()

    def collect(self) -> int:
        """Read every message published since into ``pending``; returns how many."""
        from jobs.scheduling.pacing import SCHEDULE_NOTIFIER

        SCHEDULE_NOTIFIER.flush()
        from kombu.transport.memory import Channel

        if self._channel is None:
            self._connection = self.app.connection_for_read()
            self._channel = self._connection.default_channel
        count = 0
        for queue in self.queues:
            stored = Channel.queues.get(queue)
            while stored is not None and not stored.empty():
                raw = self._channel.message_to_python(stored.get_nowait())
                args, kwargs, _embed = raw.decode()
                headers = raw.headers or {}
                eta = headers.get("eta")
                self.pending.append(Message(next(self.serial), headers["task"], list(args), dict(kwargs),
                                            dt.datetime.fromisoformat(eta) if eta else None,
                                            int(headers.get("retries") or 0), queue))
                count += 1
        return count

    def due(self, now: dt.datetime) -> list[Message]:
        """The pending messages whose eta has come, in publication order."""
        return [m for m in self.pending if m.eta is None or m.eta <= now]

    def beat(self, now: dt.datetime) -> int:
        """Publish each periodic task whose time has come (beat's first round runs every task at once)."""
        published = 0
        for task, every in self.beat_every.items():
            if self.beat_next.get(task, now) <= now:
                self.app.tasks[task].apply_async()
                self.beat_next[task] = now + dt.timedelta(seconds=every)
                published += 1
        return published

    def deliver(self, message: Message, *, keep: bool = False) -> Delivery:
        """Run ``message``'s task here as a worker would and take it out of ``pending`` (``keep``: leave it there
        too, a duplicate delivery). An exception other than a retry is recorded in ``errors``."""
        if not keep and message in self.pending:
            self.pending.remove(message)
        task = self.app.tasks[message.task]
        self.deliveries += 1
        close_old_connections()
        task.push_request(id=f"sim-{message.serial}", args=message.args, kwargs=message.kwargs,
                          retries=message.retries, called_directly=False, is_eager=False, hostname="sim@worker",
                          delivery_info={"exchange": "", "routing_key": message.queue, "priority": 0,
                                         "redelivered": False})
        try:
            task.run(*message.args, **message.kwargs)
            outcome = Delivery(message, "ok")
        except Retry:
            outcome = Delivery(message, "retry")
        except Exception as exc:  # noqa: BLE001 - a task that raises is what the simulation looks for: recorded
            if isinstance(exc, tuple(getattr(task, "autoretry_for", ()) or ())) and \
                    message.retries >= (task.max_retries or 0):
                # Its autoretries are spent: the task gives up as designed (a dispatch: reconcile's dispatch
                # deadline takes over); not a crash.
                return Delivery(message, "gave_up", repr(exc))
            outcome = Delivery(message, "error", "".join(traceback.format_exc(limit=6).splitlines(True)[-8:]))
            self.errors.append(outcome)
            if connection.in_atomic_block is False and connection.needs_rollback:
                connection.rollback()
        finally:
            task.pop_request()
        return outcome
