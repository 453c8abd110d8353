"""The Kubernetes namespace of a team: one rule for the runner that creates it and the metrics that read it."""

from __future__ import annotations

from django.conf import settings


def team_namespace(team_slug: str) -> str:
    """The namespace of team ``team_slug``'s pods: ``settings.K8S_NAMESPACE_PREFIX`` + the slug (``cp-ml-research``
    by default), cut to 63 characters and stripped of trailing dashes, as a namespace name is a DNS label
    (RFC 1123, Kubernetes' object names)."""
    return f"{settings.K8S_NAMESPACE_PREFIX}{team_slug}"[:63].rstrip("-")
