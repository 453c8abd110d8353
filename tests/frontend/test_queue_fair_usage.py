"""The Queue page shows each waiting job's team's decayed GPU usage over time (docs/adr/0045): decayed GPU-hours,
GPU-hours per unit of weight and its part of its cohort's, with the half-life in the page's explanation."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.utils import timezone

from quotas.models import Team, TeamUsage
from tests.support.factories import make_job_row
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


def decayed_cell(page: str, job_id: int) -> str:
    row = re.search(rf'<tr id="queue-job-{job_id}">(.*?)</tr>', page, re.S).group(1)
    return " ".join(re.search(r'data-col="decayed">(.*?)</span>', row, re.S).group(1).split())


def test_the_queue_shows_each_teams_decayed_gpu_hours_per_weight_and_cohort_share(teams, staff, outsider, h100):
    alpha, beta = teams
    Team.objects.filter(pk=alpha.pk).update(weight=Decimal("4"))
    now = timezone.now()
    # 30 and 10 GPU-hours (less a few seconds' decay by the time the page reads them)
    TeamUsage.objects.create(team=alpha, gpu_seconds=Decimal(30 * 3600), sampled_at=now)
    TeamUsage.objects.create(team=beta, gpu_seconds=Decimal(10 * 3600), sampled_at=now)
    a = make_job_row(alpha, staff.user, h100, name="a", gpus_per_node=8)
    b = make_job_row(beta, outsider.user, h100, name="b", gpus_per_node=8)

    page = signed_in(staff).get("/queue/").content.decode()
    # per weight: alpha 30 / 4 = 7.5, beta 10 / 1 = 10; cohort shares 7.5 / 17.5 = 43 %, 10 / 17.5 = 57 %
    assert decayed_cell(page, a.pk) == "decayed 30.00 GPU-hours, 7.50 per unit of weight, 43% of its cohort's"
    assert decayed_cell(page, b.pk) == "decayed 10.00 GPU-hours, 10.00 per unit of weight, 57% of its cohort's"
    assert "past use counts half after 7 days" in page

    mine = signed_in(outsider).get("/queue/").content.decode()
    assert f"queue-job-{a.pk}" not in mine and decayed_cell(mine, b.pk).startswith("decayed 10.00 GPU-hours")
    # beta's member may not see alpha, which beta's cohort share (with beta's own figure) would give away
    assert "of its cohort's" not in decayed_cell(mine, b.pk), decayed_cell(mine, b.pk)
