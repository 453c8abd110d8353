"""The mapping from an OpenID Connect provider's groups to teams, roles and platform administration (ADR 0032).

``OIDC_GROUP_MAP`` is a JSON object: each key a group name exactly as the provider's groups claim spells it, each
value one grant or a list of grants. A grant is ``"<team-slug>:<role>"`` (role ``admin``, ``member`` or
``viewer``) or ``"platform-admin"`` (Django's ``is_staff``). For example::

    {"ml-alpha": "alpha:member", "ml-alpha-leads": ["alpha:admin", "beta:viewer"], "ml-platform": "platform-admin"}

Groups the map does not name grant nothing. When several groups give one team, the strongest role wins
(``admin`` over ``member`` over ``viewer``). This module reads settings-time text only and imports no model, so
``controlplane/settings.py`` checks the map at start-up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

from django.core.exceptions import ImproperlyConfigured

#: The grant that makes a user platform staff (``is_staff``).
PLATFORM_ADMIN = "platform-admin"
#: ``quotas.models.Membership.Role`` values, weakest first (repeated here: settings cannot import models; a test
#: compares the two).
ROLES = ("viewer", "member", "admin")
# A team slug as Django's SlugField accepts it (quotas.models.Team.slug).
_GRANT = re.compile(r"^(?P<slug>[-a-zA-Z0-9_]+):(?P<role>[a-z]+)$")


def parse_group_map(text: str) -> dict[str, tuple[str, ...]]:
    """``OIDC_GROUP_MAP``'s JSON text as ``{group: (grant, ...)}``; an empty text is an empty map.

    Raises ``ImproperlyConfigured`` for text that is not a JSON object of strings or lists of strings, and for a
    grant that is neither ``platform-admin`` nor ``<team-slug>:<role>`` with a known role: a typing error in
    the map fails at start-up instead of silently granting less.
    """
    if not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"OIDC_GROUP_MAP is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("OIDC_GROUP_MAP must be a JSON object of group name -> grant(s)")
    parsed = {}
    for group, value in raw.items():
        grants = [value] if isinstance(value, str) else value
        if not isinstance(grants, list) or not all(isinstance(grant, str) for grant in grants):
            raise ImproperlyConfigured(f"OIDC_GROUP_MAP[{group!r}] must be a grant or a list of grants")
        for grant in grants:
            match = _GRANT.match(grant)
            if grant != PLATFORM_ADMIN and not (match and match["role"] in ROLES):
                raise ImproperlyConfigured(
                    f"OIDC_GROUP_MAP[{group!r}]: {grant!r} is neither {PLATFORM_ADMIN!r} nor "
                    f"'<team-slug>:<role>' with a role in {', '.join(ROLES)}"
                )
        parsed[group] = tuple(grants)
    return parsed


def entitlements(groups: Iterable[str], group_map: Mapping[str, tuple[str, ...]]) -> tuple[dict[str, str], bool]:
    """What ``groups`` (the groups claim, a list of names) grant under ``group_map`` (``parse_group_map``'s):
    ``({team_slug: role}, is_staff)``, the strongest role per team."""
    roles: dict[str, str] = {}
    staff = False
    for group in groups:
        for grant in group_map.get(group, ()):
            if grant == PLATFORM_ADMIN:
                staff = True
                continue
            slug, _, role = grant.partition(":")
            if slug not in roles or ROLES.index(role) > ROLES.index(roles[slug]):
                roles[slug] = role
    return roles, staff
