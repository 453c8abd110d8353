"""Scheduling against the database: passes, their pacing and coalescing, and passes racing each other."""
