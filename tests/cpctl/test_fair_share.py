"""``cpctl fair-share`` against the live API: each team's decayed GPU-hours, weight, GPU-hours per unit of weight and
cohort share, the least used first; a member sees their own teams, staff every team (docs/adr/0045)."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal

from django.utils import timezone

from quotas.models import Team, TeamUsage


def rows(text: str) -> list[list[str]]:
    """A printed table's rows (header first), split on runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def test_fair_share_lists_decayed_gpu_hours_weight_and_share_in_the_schedulers_order(run_cli, teammate, staff,
                                                                                       teams, settings):
    alpha, beta = teams
    Team.objects.filter(pk=alpha.pk).update(weight=Decimal("2"))
    now = timezone.now()
    # 8 decayed GPU-hours for alpha and 2 for beta, as of now: moved to the request's time they decay a little
    TeamUsage.objects.create(team=alpha, gpu_seconds=Decimal(8 * 3600), sampled_at=now)
    TeamUsage.objects.create(team=beta, gpu_seconds=Decimal(2 * 3600), sampled_at=now)

    table = rows(run_cli("fair-share", persona=staff).out)
    assert table[0] == ["TEAM", "COHORT", "DECAYED GPU-H", "WEIGHT", "PER WEIGHT", "COHORT SHARE"]
    # beta 2 / 1 = 2 per weight before alpha 8 / 2 = 4; shares of 6 in the default cohort: 1/3 and 2/3
    assert [(r[0], r[1], r[3], r[5]) for r in table[1:]] == [("beta", "default", "1.000", "33.3%"),
                                                             ("alpha", "default", "2.000", "66.7%")]
    assert math.isclose(float(table[2][2]), 8, rel_tol=1e-4) and math.isclose(float(table[2][4]), 4, rel_tol=1e-4)

    mine = json.loads(run_cli("fair-share", "--json", persona=teammate).out)
    assert mine["half_life_seconds"] == settings.FAIR_SHARING_USAGE_HALF_LIFE_SECONDS
    assert [r["team"] for r in mine["results"]] == ["alpha"]  # a member sees only their teams
    # the cohort share with alpha's own figure would give beta's away: shown only to who may see every team of it
    assert mine["results"][0]["cohort_share"] is None
    assert Decimal(mine["results"][0]["weighted_gpu_hours"]).quantize(Decimal("0.001")) == Decimal("4.000")
