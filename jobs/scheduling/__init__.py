"""Scheduling, decomposed as Kueue does it: a pure core that decides, and the database layer around it.

- ``core``: the pure decision core (model, placement, rules, order,
  preemption, the decision loop); imports nothing from Django.

This package module imports nothing, so the core stays importable without Django.
"""
