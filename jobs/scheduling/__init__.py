"""Scheduling, decomposed as Kueue does it: a pure core that decides, and the database layer around it.

- ``core``: the pure decision core (model, placement, rules, order,
  preemption, the decision loop); imports nothing from Django.
- ``snapshot``: reads the snapshot a pass decides on (with a per-process
  cache of waiting rows) and the one-job snapshots of a re-check or a preview.
- ``offers``: node pools as the core sees them (free GPUs, price now).
- ``apply``: commits the core's decisions, re-checking each admission under
  row locks with the core's own rules.
- ``passes``: the entry points (``schedule_pending``, ``try_admit``,
  ``schedule_coalesced``, ``PassResult``).
- ``pacing``: when passes are published and run (the Redis flag, the
  notifier, the pause between passes, the advisory lock).
- ``preview``: what the submission form shows before a job exists.

This package module imports nothing, so the core stays importable without Django.
"""
