"""Single sign-on accounts: the user an OpenID Connect provider's verified claims sign in, and the memberships and
staff flag its groups claim grants (ADR 0032).

``sign_in`` is the one write path. It finds the account by (issuer, ``sub``), never by email: an email address
can be changed or reused at the provider, and a match by email would hand an existing account (a local one, an
administrator's) to whoever the provider lets set that address. A new subject gets a new user; its username is
the provider's ``preferred_username`` (``OIDC_USERNAME_CLAIM``), made unique with a ``-2``, ``-3``... suffix, so
it never takes over a local account of the same name.

The groups claim is the whole truth about a single sign-on user's access: at every sign-in, in one transaction,
the memberships of the teams it grants are created or given the granted role, every other membership of that user
is removed (also one an administrator added by hand), and ``is_staff`` is set or cleared. Each membership change
and each change of ``is_staff`` writes an audit record (``quotas.audit.record``) in the same transaction. Teams the map names that do not
exist are logged and skipped, never created. Local accounts (no ``OidcIdentity``) are never touched.
``is_superuser`` is never granted or removed, and a user deactivated locally (``is_active`` false) stays refused
and signed out (``quotas.oidc.OidcBackend``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from . import audit
from .groupmap import entitlements
from .models import Membership, OidcIdentity, Team

logger = logging.getLogger(__name__)

#: The source an audit record of a membership change made at sign-in names.
EVENT_SOURCE = "oidc-groups"
#: The reason the audit records of a sign-in give.
SSO_REASON = "single sign-on: the groups claim of the latest sign-in"
# Characters Django's username validator accepts (UnicodeUsernameValidator: letters, digits and @.+-_).
_NOT_USERNAME = re.compile(r"[^\w.@+-]")
_USERNAME_MAX = 150 - 4  # room for a "-999" suffix


class ClaimsRefused(ValueError):
    """The claims cannot sign anyone in: no ``sub``, or a groups claim that is not a list of strings."""


def groups_of(claims: Mapping, groups_claim: str) -> list[str]:
    """The groups claim ``claims[groups_claim]`` as a list of names; a missing claim is no groups.

    Raises ``ClaimsRefused`` when the claim is present but not a list of strings (a provider misconfiguration
    that must not read as "no groups" silently).
    """
    groups = claims.get(groups_claim, [])
    if not isinstance(groups, list) or not all(isinstance(group, str) for group in groups):
        raise ClaimsRefused(f"the {groups_claim!r} claim is not a list of strings")
    return groups


def _free_username(claims: Mapping, username_claim: str) -> str:
    """A username nobody has yet, from ``claims[username_claim]`` or the local part of ``email``."""
    wanted = claims.get(username_claim) or (claims.get("email") or "").partition("@")[0] or "user"
    base = _NOT_USERNAME.sub("-", str(wanted))[:_USERNAME_MAX] or "user"
    taken = set(get_user_model().objects.filter(username__startswith=base).values_list("username", flat=True))
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _profile(user, claims: Mapping) -> list[str]:
    """Copy the display claims (email, given and family name) onto ``user``; the fields that changed."""
    changed = []
    for field, claim, limit in (
        ("email", "email", 254),
        ("first_name", "given_name", 150),
        ("last_name", "family_name", 150),
    ):
        value = str(claims.get(claim) or "")[:limit]
        if getattr(user, field) != value:
            setattr(user, field, value)
            changed.append(field)
    return changed


def _sync_memberships(user, roles: Mapping[str, str]) -> None:
    """Make ``user``'s memberships exactly ``roles`` ({team slug: role}) for the teams that exist; an audit
    record per change. Call inside the sign-in's transaction."""
    teams = {team.slug: team for team in Team.objects.filter(slug__in=roles)}
    for slug in sorted(set(roles) - set(teams)):
        logger.warning(
            "single sign-on of %s: the group map grants team %r, which does not exist; skipped", user.username, slug
        )
    current = {m.team_id: m for m in Membership.objects.select_for_update().filter(user=user).select_related("team")}
    for slug, team in teams.items():
        role = roles[slug]
        membership = current.pop(team.pk, None)
        if membership is None:
            membership = Membership.objects.create(team=team, user=user, role=role)
            audit.record(None, "created", membership, {}, {"role": role, "source": EVENT_SOURCE}, SSO_REASON)
        elif membership.role != role:
            old = membership.role
            membership.role = role
            membership.save(update_fields=["role"])
            audit.record(None, "updated", membership, {"role": old}, {"role": role, "source": EVENT_SOURCE}, SSO_REASON)
    for membership in current.values():
        audit.record(None, "deleted", membership, {"role": membership.role}, {"source": EVENT_SOURCE}, SSO_REASON)
        membership.delete()


def sign_in(
    issuer: str,
    claims: Mapping,
    *,
    group_map: Mapping[str, tuple[str, ...]],
    groups_claim: str = "groups",
    username_claim: str = "preferred_username",
):
    """The user that verified ``claims`` (the ID token's and userinfo's, merged) of provider ``issuer`` sign in,
    created on first sign-in, with memberships and ``is_staff`` set from the groups claim, all in one transaction.

    ``group_map`` is ``quotas.groupmap.parse_group_map``'s result. Raises ``ClaimsRefused`` when ``sub`` is
    missing or the groups claim is malformed; nothing is written then.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise ClaimsRefused("the claims have no 'sub'")
    groups = groups_of(claims, groups_claim)
    roles, staff = entitlements(groups, group_map)
    user_model = get_user_model()
    with transaction.atomic():
        identity = (
            OidcIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is None:
            user = user_model(username=_free_username(claims, username_claim))
            user.set_unusable_password()
            _profile(user, claims)
            user.save()
            identity = OidcIdentity(user=user, issuer=issuer, subject=subject)
            logger.info("single sign-on created user %s for subject %s of %s", user.username, subject, issuer)
        else:
            user = user_model.objects.select_for_update().get(pk=identity.user_id)
            changed = _profile(user, claims)
            if changed:
                user.save(update_fields=changed)
        if user.is_staff != staff:
            audit.record(
                None, "updated", user, {"is_staff": user.is_staff}, {"is_staff": staff, "source": EVENT_SOURCE},
                SSO_REASON,
            )
            user.is_staff = staff
            user.save(update_fields=["is_staff"])
        _sync_memberships(user, roles)
        identity.groups = groups
        identity.signed_in_at = timezone.now()
        identity.save()
    return user
