"""In a tree of cohorts (ADR 0046) a team's reachable limit is what every level above lets it hold with nothing in
use, the same number in the quota model and in the scheduler's snapshot; worked out by hand."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.scheduling.core import FairShareScheduler
from jobs.scheduling.snapshot import load_snapshot
from quotas.models import Cohort, CohortQuota, Quota, Team
from tests.support.factories import make_job_row


@pytest.mark.django_db
def test_the_model_and_the_scheduler_say_the_same_reachable_limit_in_a_tree(h100, user):
    org = Cohort.objects.create(name="org")
    research = Cohort.objects.create(name="research", parent=org)
    product = Cohort.objects.create(name="product", parent=org)
    # research: own 2 GPUs, may borrow 3 from the org; product lends at most 1 of its subtree
    CohortQuota.objects.create(cohort=research, accelerator=h100, nominal_gpus=2, borrowing_limit_gpus=3)
    CohortQuota.objects.create(cohort=product, accelerator=h100, nominal_gpus=0, lending_limit_gpus=1)
    rows = {}
    for slug, cohort, nominal, borrowing in [("a", research, 4, 20), ("b", research, 1, 0), ("c", product, 8, 20)]:
        team = Team.objects.create(slug=slug, name=slug, cohort=cohort)
        rows[slug] = Quota.objects.create(team=team, accelerator=h100, nominal_gpus=nominal,
                                          borrowing_limit_gpus=borrowing)
        make_job_row(team, user, h100, name="j", gpus_per_node=1, nodes=1)
    # by hand: research holds 2 + 4 + 1 = 7 inside and may borrow 3, but product lends only 1 of its 8: a reaches
    # 7 + 1 = 8, not 7 + 3; b reaches its nominal 1 (borrowing limit 0); c: product's 8 plus research's 7 idle = 15
    # (research has no lending limit)
    expected = {"a": 8, "b": 1, "c": 15}
    scheduler = FairShareScheduler(load_snapshot(timezone.now()).snapshot)
    for slug, reachable in expected.items():
        q = rows[slug]
        assert q.reachable_gpus() == reachable, slug
        assert scheduler.teams[q.team_id].quotas[h100.pk].reachable_gpus == reachable, slug
