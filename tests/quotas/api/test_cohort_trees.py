"""Trees of cohorts through the API (ADR 0046): staff nest cohorts and set each level's quota, a loop is a 400 that
names the chain, team admins cannot change a level (their own department included, ADR 0029), every change is
audited, and ``cohort-trees/`` shows each level's quota and usage summed over its subtree, a team's own usage only
to its members and staff."""

from decimal import Decimal

import pytest

from quotas.models import MAX_COHORT_DEPTH, AuditRecord, Cohort, CohortQuota, Quota, Team
from tests.support.factories import make_attempt, make_job_row

pytestmark = pytest.mark.django_db


def nest(staff, name, parent=None):
    r = staff.client.post("/api/v1/cohorts/", {"name": name, "parent": parent}, format="json")
    assert r.status_code == 201, r.content
    return Cohort.objects.get(name=name)


def test_staff_nest_cohorts_and_a_loop_is_400_naming_the_chain(staff):
    org = nest(staff, "org")
    research = nest(staff, "research", "org")
    vision = nest(staff, "vision", "research")
    r = staff.client.patch(f"/api/v1/cohorts/{org.pk}/", {"parent": "vision"}, format="json")
    assert r.status_code == 400
    assert r.json()["parent"] == [
        "the parent chain would loop back to this cohort: vision > research > org (each cohort's parent after it)"]
    r = staff.client.patch(f"/api/v1/cohorts/{org.pk}/", {"parent": "org"}, format="json")
    assert r.status_code == 400 and r.json()["parent"] == ["a cohort cannot be its own parent"]
    assert Cohort.objects.get(pk=org.pk).parent_id is None
    body = staff.client.get(f"/api/v1/cohorts/{research.pk}/").json()
    assert (body["parent"], body["children"]) == ("org", ["vision"])
    r = staff.client.delete(f"/api/v1/cohorts/{research.pk}/")
    assert r.status_code == 400 and "vision" in r.json()["parent"][0]
    assert Cohort.objects.filter(pk=vision.pk, parent=research).exists()


def test_a_team_admin_cannot_raise_a_level_of_their_own_tree(staff, owner, alpha, h100):
    research = nest(staff, "research")
    Team.objects.filter(pk=alpha.pk).update(cohort=research)
    r = staff.client.post("/api/v1/cohort-quotas/", {"cohort": "research", "accelerator": h100.name,
                                                      "nominal_gpus": 8, "borrowing_limit_gpus": 2,
                                                      "lending_limit_gpus": 4}, format="json")
    assert r.status_code == 201, r.content
    quota = CohortQuota.objects.get()
    assert (quota.nominal_gpus, quota.borrowing_limit_gpus, quota.lending_limit_gpus) == (8, 2, 4)
    assert owner.client.patch(f"/api/v1/cohort-quotas/{quota.pk}/", {"nominal_gpus": 80},
                              format="json").status_code == 403
    assert owner.client.patch(f"/api/v1/cohorts/{research.pk}/", {"weight": "5"}, format="json").status_code == 403
    assert owner.client.post("/api/v1/cohort-quotas/", {"cohort": "research", "accelerator": "A100-80GB",
                                                        "nominal_gpus": 8}, format="json").status_code == 403
    assert CohortQuota.objects.get().nominal_gpus == 8 and Cohort.objects.get(pk=research.pk).weight == Decimal(1)
    event = AuditRecord.objects.get(object_type="cohortquota")
    assert (event.actor, event.after["nominal_gpus"], event.after["borrowing_limit_gpus"]) == (staff.user, 8, 2)
    r = staff.client.post("/api/v1/cohort-quotas/", {"cohort": "research", "accelerator": h100.name,
                                                      "nominal_gpus": 1}, format="json")
    assert r.status_code == 400 and "accelerator" in r.json()
    r = staff.client.post("/api/v1/cohort-quotas/", {"cohort": "research", "accelerator": "CPU",
                                                      "nominal_gpus": 1}, format="json")
    assert r.status_code == 400 and "accelerator" in r.json()


def test_the_tree_shows_quota_and_usage_per_level_and_a_teams_usage_to_its_members(
        staff, owner, outsider, alpha, beta, h100, aws_cluster):
    org = nest(staff, "org")
    nest(staff, "research", "org")
    nest(staff, "product", "org")
    research = Cohort.objects.get(name="research")
    CohortQuota.objects.create(cohort=org, accelerator=h100, nominal_gpus=4)
    CohortQuota.objects.create(cohort=research, accelerator=h100, nominal_gpus=2, borrowing_limit_gpus=2,
                               lending_limit_gpus=1)
    Team.objects.filter(pk=alpha.pk).update(cohort=research)
    Team.objects.filter(pk=beta.pk).update(cohort=Cohort.objects.get(name="product"))
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=4, borrowing_limit_gpus=8)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=8)
    job = make_job_row(alpha, owner.user, h100, gpus_per_node=6)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])

    body = owner.client.get("/api/v1/cohort-trees/").json()
    assert [t["name"] for t in body] == ["org"]
    root = body[0]
    (row,) = root["accelerators"]
    # org's sums count beta, not alpha's admin's team: only org's own quota is shown to them
    assert (row["nominal_gpus"], row["nominal_in_subtree_gpus"], row["used_gpus"], row["borrowed_gpus"]) == (
        4, None, None, None)
    (row,) = staff.client.get("/api/v1/cohort-trees/").json()[0]["accelerators"]
    # by hand: nominal inside org = 4 + 2 + 4 + 8; alpha holds 6
    assert (row["nominal_gpus"], row["nominal_in_subtree_gpus"], row["used_gpus"], row["borrowed_gpus"]) == (4, 18, 6, 0)
    dept = {c["name"]: c for c in root["children"]}
    (r,) = dept["research"]["accelerators"]
    # research: own 2 + alpha's 4 = 6 nominal inside, 6 held; it lends at most 1 of its subtree quota of 6: 5 kept
    assert (r["nominal_in_subtree_gpus"], r["used_gpus"], r["borrowed_gpus"], r["borrowing_limit_gpus"]) == (6, 6, 0, 2)
    assert (r["subtree_quota_gpus"], r["guaranteed_gpus"]) == (6, 5)
    (team,) = dept["research"]["teams"]
    assert team["slug"] == "alpha" and team["accelerators"][0]["used_gpus"] == 6
    # alpha may take 2 more: research's 6 nominal + its borrowing limit 2 = 8
    assert team["accelerators"][0]["available_gpus"] == 2
    (other,) = dept["product"]["teams"]
    assert other["slug"] == "beta"  # not alpha's admin's team: none of its figures
    assert {k: v for k, v in other["accelerators"][0].items() if k != "accelerator"} == dict.fromkeys(
        ("nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus", "used_gpus", "available_gpus"))
    seen = outsider.client.get(f"/api/v1/cohort-trees/{research.pk}/").json()
    assert seen["name"] == "research" and seen["teams"][0]["accelerators"][0]["used_gpus"] is None
    assert seen["accelerators"][0]["used_gpus"] is None and seen["accelerators"][0]["nominal_gpus"] == 2
    assert staff.client.get(f"/api/v1/cohort-trees/{research.pk}/").json()["teams"][0]["accelerators"][0][
        "used_gpus"] == 6
    assert owner.client.get("/api/v1/cohort-trees/999999/").status_code == 404


def test_moving_a_cohort_with_descendants_counts_their_levels_toward_the_depth_limit(staff):
    """Two chains of five levels each: hanging one under the other's deepest cohort would make ten levels, more than
    ``MAX_COHORT_DEPTH``; hanging it three levels lower down makes exactly eight, which is allowed."""
    for prefix in ("a", "b"):
        parent = None
        for depth in range(5):
            nest(staff, f"{prefix}{depth}", parent)
            parent = f"{prefix}{depth}"
    b0 = Cohort.objects.get(name="b0")
    r = staff.client.patch(f"/api/v1/cohorts/{b0.pk}/", {"parent": "a4"}, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["parent"] == [f"a tree of cohorts has at most {MAX_COHORT_DEPTH} levels: 5 above this cohort "
                                  "and 5 from it down to its deepest descendant"]
    assert Cohort.objects.get(pk=b0.pk).parent_id is None
    r = staff.client.patch(f"/api/v1/cohorts/{b0.pk}/", {"parent": "a2"}, format="json")
    assert r.status_code == 200, r.content  # a0 > a1 > a2 > b0 > b1 > b2 > b3 > b4: eight levels


def test_a_cohort_that_still_has_teams_is_not_deleted(staff, alpha, beta, h100):
    research = nest(staff, "research")
    CohortQuota.objects.create(cohort=research, accelerator=h100, nominal_gpus=4)
    Team.objects.filter(pk__in=[alpha.pk, beta.pk]).update(cohort=research)
    r = staff.client.delete(f"/api/v1/cohorts/{research.pk}/")
    assert r.status_code == 400, r.content
    assert r.json() == {"teams": ["cohort research has the teams alpha, beta: give them another cohort first"]}
    assert set(Team.objects.filter(cohort=research).values_list("slug", flat=True)) == {"alpha", "beta"}
    assert CohortQuota.objects.filter(cohort=research).exists()
    Team.objects.filter(pk__in=[alpha.pk, beta.pk]).update(cohort=None)
    assert staff.client.delete(f"/api/v1/cohorts/{research.pk}/").status_code == 204


def test_a_levels_sums_are_hidden_from_a_reader_who_may_not_see_every_team_below_it(
        staff, owner, alpha, beta, h100, aws_cluster):
    """Class: an aggregate that lets another team's figures through by subtraction. Alpha and beta share the
    department "pair"; beta holds 3 GPUs. Were the department's usage shown to alpha's admin, it less alpha's own
    (0) would be beta's 3."""
    pair = nest(staff, "pair")
    Team.objects.filter(pk__in=[alpha.pk, beta.pk]).update(cohort=pair)
    CohortQuota.objects.create(cohort=pair, accelerator=h100, nominal_gpus=1)
    Quota.objects.create(team=beta, accelerator=h100, nominal_gpus=4)
    Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=2)
    job = make_job_row(beta, beta.memberships.first().user if beta.memberships.exists() else owner.user, h100,
                       gpus_per_node=3)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])

    (tree,) = owner.client.get("/api/v1/cohort-trees/").json()
    (row,) = tree["accelerators"]
    assert row["nominal_gpus"] == 1  # the cohort's own quota is every reader's
    hidden = ("nominal_in_subtree_gpus", "used_gpus", "borrowed_gpus", "subtree_quota_gpus", "guaranteed_gpus")
    assert [row[k] for k in hidden] == [None] * len(hidden), row
    teams = {t["slug"]: t["accelerators"][0] for t in tree["teams"]}
    assert teams["beta"]["nominal_gpus"] is None and teams["beta"]["used_gpus"] is None
    assert teams["alpha"]["nominal_gpus"] == 2 and teams["alpha"]["used_gpus"] == 0
    (row,) = staff.client.get("/api/v1/cohort-trees/").json()[0]["accelerators"]
    assert (row["nominal_in_subtree_gpus"], row["used_gpus"]) == (1 + 4 + 2, 3)
