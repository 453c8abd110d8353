"""Notifications of job ends, failures, preemptions, recoveries and budget thresholds, by e-mail and webhook
(docs/adr/0035-notifications.md)."""
