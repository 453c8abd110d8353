"""Shared framework code of the control plane; it imports no app of the project.

``viewsets`` (team-scoped base viewsets), ``permissions``, ``fields`` (strict
serializer fields), ``money`` (USD presentation), ``parsers`` (JSON and safe
YAML), ``pagination``, ``lookups`` (the per-process lookup-cache registry)
and ``metrics`` (the Celery worker exporter).
"""
