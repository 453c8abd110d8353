"""The Cohorts page (ADR 0046): every tree with each level's quota and usage; a team's usage only to its members."""

import pytest

from quotas.models import Cohort, CohortQuota, Quota, Team
from tests.support.factories import make_attempt, make_job
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def test_the_page_shows_the_tree_and_hides_another_teams_usage(owner, outsider, teams, h100, aws_cluster):
    org = Cohort.objects.create(name="org")
    research = Cohort.objects.create(name="research", parent=org)
    CohortQuota.objects.create(cohort=research, accelerator=h100, nominal_gpus=2, borrowing_limit_gpus=3)
    Team.objects.filter(pk=teams[0].pk).update(cohort=research)
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=4, borrowing_limit_gpus=8)
    job = make_job(teams[0], owner.user, h100, gpus_per_node=5)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])

    mine = signed_in(owner).get("/cohorts/")
    theirs = signed_in(outsider).get("/cohorts/")

    assert mine.status_code == 200 and theirs.status_code == 200
    page = mine.content.decode()
    assert "research" in page and "org" in page and 'href="/teams/alpha/"' in page
    # alpha's row: nominal 4, borrowing limit 8, 5 held, 1 more available (org holds only 6: research's 2 + alpha's 4)
    assert "<td>8</td><td>all</td><td>5</td><td>1</td>" in page
    other = theirs.content.decode()
    assert 'href="/teams/alpha/"' not in other
    # to a reader outside alpha none of its figures (nominal, limits, usage, room), nor research's sums, which count it
    assert "<td>–</td>" * 6 + "</tr>" in other and "<td>8</td>" not in other, other
    assert "<td>2</td><td>–</td><td>3</td><td>all</td><td>–</td>" in other, other
