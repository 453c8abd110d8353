"""Trees of cohorts in the scheduling pass against the database (ADR 0046): a department's borrowing limit holds
its teams back while another department's idle quota is still unused, the locked re-check reads the whole tree,
and a lone cohort without quotas keeps the plain rule.

Prices are cluster overrides picked here (USD per GPU-hour).
"""

import pytest

from jobs.models import JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Cohort, CohortQuota, Team
from tests.support.factories import fresh

S = JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def org(h100, quota_factory, alpha, beta):
    """org > research (nominal 2, borrowing limit 2) > alpha (nominal 4, borrowing 16), gamma (nominal 2); org >
    product > beta (nominal 8). Research's subtree: 4 + 2 + 2 = 8 nominal, so it may hold 10."""
    org = Cohort.objects.create(name="org")
    research = Cohort.objects.create(name="research", parent=org)
    product = Cohort.objects.create(name="product", parent=org)
    CohortQuota.objects.create(cohort=research, accelerator=h100, nominal_gpus=2, borrowing_limit_gpus=2)
    gamma = Team.objects.create(slug="gamma", name="Gamma", cohort=research)
    Team.objects.filter(pk=alpha.pk).update(cohort=research)
    Team.objects.filter(pk=beta.pk).update(cohort=product)
    quota_factory(alpha, h100, nominal=4, borrowing=16)
    quota_factory(gamma, h100, nominal=2)
    quota_factory(beta, h100, nominal=8)
    return {"org": org, "research": research, "product": product, "gamma": gamma}


def test_a_department_borrows_only_up_to_its_borrowing_limit(cluster_factory, h100, alpha, queue_job, org):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, gpus_per_node=8, price="6.88")  # 32 GPUs
    a, b, c = queue_job(alpha, 8), queue_job(alpha, 2), queue_job(alpha, 1)

    result = schedule_pending()

    # alpha alone could reach 4 + 16; research holds at most its 8 nominal + 2 borrowed
    assert result.admitted == [a.pk, b.pk]
    c = fresh(c)
    assert c.state == S.QUEUED and c.queue_info["reason"] == "quota"
    assert c.queue_info["limit_gpus"] == 10


def test_the_department_limit_binds_across_its_teams(cluster_factory, h100, alpha, queue_job, org):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, gpus_per_node=8, price="6.88")
    a = queue_job(alpha, 8)
    schedule_pending()
    g = queue_job(org["gamma"], 2)  # within gamma's own nominal, but research holds 8 of 10 and gamma's 2 are lent

    schedule_pending()

    assert fresh(a).state == S.ADMITTED
    assert fresh(g).state == S.ADMITTED  # 8 + 2 = 10: exactly research's limit
    h = queue_job(alpha, 1)
    schedule_pending()
    h = fresh(h)
    assert h.state == S.QUEUED and h.queue_info["reason"] == "quota"


def test_a_lone_cohort_without_quotas_keeps_the_plain_rule(cluster_factory, h100, alpha, beta, quota_factory,
                                                            queue_job):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, gpus_per_node=8, price="6.88")
    flat = Cohort.objects.create(name="flat")
    Team.objects.filter(pk__in=[alpha.pk, beta.pk]).update(cohort=flat)
    quota_factory(alpha, h100, nominal=4, borrowing=8)
    quota_factory(beta, h100, nominal=8)
    a, b = queue_job(alpha, 8), queue_job(alpha, 4)

    assert schedule_pending().admitted == [a.pk, b.pk]  # 4 nominal + 8 borrowed from beta
