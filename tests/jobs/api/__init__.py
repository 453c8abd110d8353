"""The jobs REST API under /api/v1/jobs/: submission, validation, reads, cancel, events, attempts and logs."""
