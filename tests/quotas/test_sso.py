"""Single sign-on accounts (ADR 0032): the group map, and what a sign-in does to users, memberships and staff rights.

The provider's claims are given as the verified dictionaries ``quotas.oidc.OidcBackend`` hands to
``quotas.sso.sign_in``; tests/frontend/test_single_sign_on.py runs the same path through a real provider.
"""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured

from controlplane import deployment
from quotas import sso
from quotas.groupmap import PLATFORM_ADMIN, ROLES, entitlements, parse_group_map
from quotas.models import AuditRecord, Membership, OidcIdentity, Team

ISSUER = "https://id.example.com"
GROUP_MAP = parse_group_map(
    '{"ml-alpha": "alpha:member", "ml-alpha-leads": ["alpha:admin", "beta:viewer"],'
    ' "ml-beta-readers": "beta:viewer", "ml-gamma": "gamma:member",'
    ' "ml-platform": "platform-admin"}'
)


def claims(sub="sub-1", groups=("ml-alpha",), **more):
    return {
        "iss": ISSUER,
        "sub": sub,
        "preferred_username": "alice",
        "email": "alice@example.com",
        "groups": list(groups),
        **more,
    }


def roles_of(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_the_map_takes_a_grant_or_a_list_of_grants_per_group():
    assert GROUP_MAP["ml-alpha"] == ("alpha:member",)
    assert GROUP_MAP["ml-alpha-leads"] == ("alpha:admin", "beta:viewer")
    assert GROUP_MAP["ml-platform"] == (PLATFORM_ADMIN,)
    assert parse_group_map("") == {} and parse_group_map("  ") == {}


@pytest.mark.parametrize(
    "text",
    [
        '["alpha:member"]',
        '{"g": "alpha:owner"}',
        '{"g": "alpha"}',
        '{"g": 3}',
        '{"g": ["alpha:member", 3]}',
        '{"g": "al pha:member"}',
        "{not json",
        '{"g": "platform-admins"}',
    ],
)
def test_a_malformed_map_stops_the_start(text):
    with pytest.raises(ImproperlyConfigured, match="OIDC_GROUP_MAP"):
        parse_group_map(text)


def test_the_map_knows_the_roles_memberships_have():
    assert set(ROLES) == set(Membership.Role.values)


def test_the_strongest_role_per_team_wins_and_unmapped_groups_grant_nothing():
    assert entitlements(["ml-alpha", "ml-alpha-leads", "someone-elses"], GROUP_MAP) == (
        {"alpha": "admin", "beta": "viewer"},
        False,
    )
    assert entitlements(["ml-alpha-leads", "ml-alpha"], GROUP_MAP) == ({"alpha": "admin", "beta": "viewer"}, False)
    assert entitlements(["ml-platform"], GROUP_MAP) == ({}, True)
    assert entitlements([], GROUP_MAP) == ({}, False)


def test_the_first_sign_in_creates_the_user_with_the_granted_memberships(teams, caplog):
    with caplog.at_level(logging.WARNING, logger="quotas.sso"):
        user = sso.sign_in(
            ISSUER,
            claims(groups=["ml-alpha", "ml-beta-readers", "ml-gamma"], given_name="Alice", family_name="Doe"),
            group_map=GROUP_MAP,
        )
    assert (user.username, user.email, user.first_name, user.last_name) == (
        "alice",
        "alice@example.com",
        "Alice",
        "Doe",
    )
    assert not user.has_usable_password() and not user.is_staff
    assert roles_of(user) == {"alpha": "member", "beta": "viewer"}
    assert not Team.objects.filter(slug="gamma").exists()
    assert "'gamma', which does not exist" in caplog.text
    identity = OidcIdentity.objects.get(user=user)
    assert (identity.issuer, identity.subject, identity.groups) == (
        ISSUER,
        "sub-1",
        ["ml-alpha", "ml-beta-readers", "ml-gamma"],
    )
    created = AuditRecord.objects.filter(object_type="membership", action="created")
    assert sorted(event.after["role"] for event in created) == ["member", "viewer"]


def test_a_later_sign_in_changes_roles_removes_teams_and_sets_staff_from_the_new_claim(teams):
    user = sso.sign_in(ISSUER, claims(groups=["ml-alpha", "ml-beta-readers"]), group_map=GROUP_MAP)
    again = sso.sign_in(
        ISSUER, claims(groups=["ml-alpha-leads", "ml-platform"], email="alice@new.example.com"), group_map=GROUP_MAP
    )
    assert again.pk == user.pk
    again.refresh_from_db()
    assert roles_of(again) == {"alpha": "admin", "beta": "viewer"} and again.is_staff
    assert again.email == "alice@new.example.com"
    third = sso.sign_in(ISSUER, claims(groups=["ml-beta-readers"]), group_map=GROUP_MAP)
    third.refresh_from_db()
    assert roles_of(third) == {"beta": "viewer"} and not third.is_staff
    events = list(
        AuditRecord.objects.filter(object_type__in=["membership", "user"])
        .order_by("id")
        .values_list("object_type", "action", "before", "after")
    )
    assert events[2:] == [
        ("user", "updated", {"is_staff": False}, {"is_staff": True, "source": sso.EVENT_SOURCE}),
        ("membership", "updated", {"role": "member"}, {"role": "admin", "source": sso.EVENT_SOURCE}),
        ("user", "updated", {"is_staff": True}, {"is_staff": False, "source": sso.EVENT_SOURCE}),
        ("membership", "deleted", {"role": "admin"}, {"source": sso.EVENT_SOURCE}),
    ]


def test_memberships_added_by_hand_to_a_single_sign_on_user_give_way_to_the_claim(teams):
    user = sso.sign_in(ISSUER, claims(groups=["ml-alpha"]), group_map=GROUP_MAP)
    Membership.objects.create(team=teams[1], user=user, role="admin")
    sso.sign_in(ISSUER, claims(groups=["ml-alpha"]), group_map=GROUP_MAP)
    assert roles_of(user) == {"alpha": "member"}


def test_no_group_signs_in_a_user_who_sees_no_team(teams):
    user = sso.sign_in(ISSUER, claims(groups=["unmapped"]), group_map=GROUP_MAP)
    assert roles_of(user) == {} and not user.is_staff
    assert list(Team.objects.visible_to(user)) == []
    no_claim = {key: value for key, value in claims(sub="sub-2").items() if key != "groups"}
    assert roles_of(sso.sign_in(ISSUER, no_claim, group_map=GROUP_MAP)) == {}


def test_a_local_account_with_the_same_name_or_email_is_never_taken_over(teams):
    local = get_user_model().objects.create_user("alice", email="alice@example.com", password="pw-alice")
    Membership.objects.create(team=teams[1], user=local, role="admin")
    user = sso.sign_in(ISSUER, claims(groups=["ml-alpha"]), group_map=GROUP_MAP)
    assert user.pk != local.pk and user.username == "alice-2"
    assert roles_of(local) == {"beta": "admin"} and local.check_password("pw-alice")
    other = sso.sign_in("https://other-issuer.example.com", claims(groups=[]), group_map=GROUP_MAP)
    assert other.pk not in (local.pk, user.pk) and other.username == "alice-3"


def test_staff_rights_come_from_the_claim_and_superuser_rights_are_never_touched(teams):
    user = sso.sign_in(ISSUER, claims(groups=["ml-platform"]), group_map=GROUP_MAP)
    assert user.is_staff
    get_user_model().objects.filter(pk=user.pk).update(is_superuser=True)
    sso.sign_in(ISSUER, claims(groups=[]), group_map=GROUP_MAP)
    user.refresh_from_db()
    assert not user.is_staff and user.is_superuser


@pytest.mark.parametrize("bad", [{"sub": ""}, {"sub": None}, {"groups": "ml-alpha"}, {"groups": ["ml-alpha", 7]}])
def test_claims_without_a_subject_or_with_a_malformed_groups_claim_write_nothing(teams, bad):
    with pytest.raises(sso.ClaimsRefused):
        sso.sign_in(ISSUER, {**claims(), **bad}, group_map=GROUP_MAP)
    assert not get_user_model().objects.exists() and not Membership.objects.exists()


def test_single_sign_on_is_configured_whole_or_not_at_all():
    complete = {
        "OIDC_RP_CLIENT_ID": "cp",
        "OIDC_RP_SIGN_ALGO": "RS256",
        "OIDC_OP_JWKS_ENDPOINT": "https://id/jwks",
        **{name: "x" for name in deployment.OIDC_REQUIRED},
    }
    deployment.refuse_partial_oidc(complete)
    deployment.refuse_partial_oidc({"OIDC_RP_CLIENT_ID": ""})
    with pytest.raises(ImproperlyConfigured, match="OIDC_OP_JWKS_ENDPOINT"):
        deployment.refuse_partial_oidc({**complete, "OIDC_OP_JWKS_ENDPOINT": ""})
    deployment.refuse_partial_oidc({**complete, "OIDC_OP_JWKS_ENDPOINT": "", "OIDC_RP_SIGN_ALGO": "HS256"})
    with pytest.raises(ImproperlyConfigured, match="OIDC_OP_ISSUER, OIDC_OP_TOKEN_ENDPOINT"):
        deployment.refuse_partial_oidc({**complete, "OIDC_OP_ISSUER": "", "OIDC_OP_TOKEN_ENDPOINT": ""})


def test_without_configuration_the_sign_in_page_has_no_provider_button_and_its_endpoints_are_404(client, db):
    page = client.get("/login/")
    assert page.status_code == 200 and b"Sign in with" not in page.content
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


def test_a_single_sign_on_user_deactivated_in_the_admin_is_signed_out(client, teams):
    user = sso.sign_in(ISSUER, claims(groups=["ml-alpha"]), group_map=GROUP_MAP)
    client.force_login(user, backend="quotas.oidc.OidcBackend")
    assert client.get("/teams/alpha/").status_code == 200
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    assert client.get("/teams/alpha/")["Location"] == "/login/?next=/teams/alpha/"
