"""A team's reachable limit (nominal + borrowing limit, at most nominal + what the other teams of its cohort can
lend, ADR 0003) is the same number in the quota model and in the scheduler's snapshot; worked out by hand."""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.scheduling.core import FairShareScheduler
from jobs.scheduling.snapshot import load_snapshot
from quotas.models import Cohort, Quota, Team
from tests.support.factories import make_job_row

# (team, cohort, nominal, borrowing, lending limit, reachable by hand)
CASES = [
    ("a", None, 4, 4, None, 6),     # the default cohort: b lends 2 (its nominal), c lends 0 (lending limit 0)
    ("b", None, 2, 10, None, 6),    # a lends 4, c 0: 2 + 4
    ("c", None, 3, 1, 0, 4),        # a 4 + b 2 = 6 lendable, its borrowing limit 1 is less
    ("x", "research", 8, 16, None, 10),  # its cohort's other team lends min(2, 5) = 2
    ("y", "research", 5, 0, 2, 5),  # borrows nothing
]


@pytest.mark.django_db
def test_the_model_and_the_scheduler_say_the_same_reachable_limit(h100, user):
    research = Cohort.objects.create(name="research")
    quotas = {}
    for slug, cohort, nominal, borrowing, lending, _ in CASES:
        team = Team.objects.create(slug=slug, name=slug, cohort=research if cohort else None)
        quotas[slug] = Quota.objects.create(team=team, accelerator=h100, nominal_gpus=nominal,
                                            borrowing_limit_gpus=borrowing, lending_limit_gpus=lending)
        make_job_row(team, user, h100, name="j", gpus_per_node=1, nodes=1)
    scheduler = FairShareScheduler(load_snapshot(timezone.now()).snapshot)
    for slug, _, _, _, _, reachable in CASES:
        q = quotas[slug]
        assert q.reachable_gpus() == reachable, slug
        assert scheduler.teams[q.team_id].quotas[h100.pk].reachable_gpus == reachable, slug
