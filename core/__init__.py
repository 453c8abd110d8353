"""Shared framework code of the control plane; it imports no app of the project.

``viewsets`` (team-scoped base viewsets), ``permissions``, ``fields`` (strict
serializer fields), ``money`` (USD presentation), ``parsers`` (JSON and safe
YAML), ``pagination``, ``lookups`` (the per-process lookup-cache registry)
``metrics`` (the Celery worker exporter), ``cohorts`` (the cohort arithmetic
of quotas: lendable part, reachable limit) and ``namespaces`` (a team's
Kubernetes namespace).
"""
