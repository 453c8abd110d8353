"""``cpctl cohorts``: the trees of cohorts against the live API (ADR 0046), each level's quota and usage."""

from __future__ import annotations

import re

from quotas.models import Cohort, CohortQuota, Quota, Team
from tests.support.factories import make_attempt, make_job


def rows(text: str) -> list[list[str]]:
    """A printed table's rows (header first), split on runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def test_cohorts_prints_the_tree_with_usage_per_level(run_cli, owner, teams, cluster_factory, catalog):
    h100 = catalog["H100-80GB"]
    cluster, pool = cluster_factory("aws-use1", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8)
    org = Cohort.objects.create(name="org")
    research = Cohort.objects.create(name="research", parent=org)
    CohortQuota.objects.create(cohort=research, accelerator=h100, nominal_gpus=2, borrowing_limit_gpus=4)
    Team.objects.filter(pk=teams[0].pk).update(cohort=research)
    Quota.objects.create(team=teams[0], accelerator=h100, nominal_gpus=4, borrowing_limit_gpus=8)
    job = make_job(teams[0], owner.user, h100, gpus_per_node=5)
    make_attempt(job, cluster, pool)

    result = run_cli("cohorts", persona=owner)

    assert result.code == 0, result.err
    table = rows(result.out)
    assert table[0] == ["LEVEL", "ACCELERATOR", "NOMINAL", "IN SUBTREE", "BORROWING LIMIT", "LENDING LIMIT", "USED",
                        "AVAILABLE"]
    assert table[1] == ["org", "H100-80GB", "0", "6", "none", "all", "5", "-"]
    assert table[2] == ["research", "H100-80GB", "2", "6", "4", "all", "5", "-"]
    # alpha: 4 nominal, 5 held; research may hold 6 + 4 but org holds only 6: 1 more
    assert table[3] == ["team alpha", "H100-80GB", "4", "4", "8", "all", "5", "1"]
    sub = run_cli("cohorts", "--cohort", str(research.pk), persona=owner)
    assert sub.code == 0 and rows(sub.out)[1][0] == "research"
