"""Scheduling, decomposed as Kueue does it: a pure core that decides, and the database layer around it.

- ``core``: the pure decision core (model, placement, rules, order,
  preemption, the decision loop); imports nothing from Django.
- ``snapshot``: reads the snapshot a pass decides on (with a per-process
  cache of waiting rows) and the snapshots of a locked re-check or a preview.
- ``offers``: node pools as the core sees them (free GPUs, price now).
- ``apply``: commits the core's decisions, re-checking the admissions under
  row locks with the core's own rules.
- ``passes``: the entry points (``schedule_pending``, ``try_admit``,
  ``schedule_coalesced``, ``PassResult``).
- ``pacing``: when passes are published and run (the Redis flag, the
  notifier, the pause between passes, the advisory lock).
- ``preview``: what the submission form shows before a job exists.

Lock order of the platform (every writer: submission, admission, cancel, the
end of an attempt, preemption, accrual, the node pool sync):

    team row -> job array row -> job row -> attempt row -> node pool rows (ascending id)
    -> budget / spend totals rows -> cost entry inserts

A transaction takes the locks it needs in this order and never one earlier in
the list after a later one. It locks only the rows it updates
(``select_for_update(of=("self",))``; a ``select_related`` without ``of``
would lock the joined cluster, accelerator and job rows too), and a row whose
key it does not change with ``no_key=True`` (FOR NO KEY UPDATE): inserts that
reference the row (a job of the team, a cost entry of the job) take only FOR
KEY SHARE on it, which that lock does not block, so a submission never waits
for an admission holding its team. A job array's row (``jobs.arrays``: its top-up and its
cancel) is locked before its element jobs. Rows of one kind are locked in ascending
id order; a job another writer holds is skipped (SKIP LOCKED) by the
scheduler rather than waited for. ``tests/jobs/test_lock_order_no_deadlocks.py``
runs the writers together on PostgreSQL and checks its deadlock counter.

This package module imports nothing, so the core stays importable without Django.
"""
