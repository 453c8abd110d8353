"""Tests of the REST API under /api/v1/, the schema, and the health endpoints."""
