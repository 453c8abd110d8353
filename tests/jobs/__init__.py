"""Tests of the jobs app: the state machine, the lifecycle, spec validation, metrics, the scheduler and the API."""
