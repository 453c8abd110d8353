"""CPU quotas in the web UI: the team page lists them in vCPUs, the dashboard shows the vCPUs the team's CPU-only
attempts hold against the limit it can reach, and a team admin edits one in vCPUs (the API's rules: a lending
limit at most nominal), audited."""

from __future__ import annotations

import pytest

from jobs.models import JobAttempt
from quotas.models import AuditRecord, Quota
from runners.models import cpu_flavor
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def cpu_quota(teams, owner, catalog):
    """Alpha's CPU quota (8 nominal + 4 borrowing vCPUs, nobody to borrow from) and a running CPU-only attempt of
    2 pods x 3 vCPUs."""
    flavor = cpu_flavor()
    cluster, pool = make_cluster("gcp-usc1", "gcp", "us-central1", flavor, nodes=2, gpus_per_node=0)
    quota = Quota.objects.create(team=teams[0], accelerator=flavor, nominal_vcpus=8, borrowing_limit_vcpus=4)
    job = make_job_row(teams[0], owner.user, flavor, name="prep", gpus_per_node=0, nodes=2, state="RUNNING")
    attempt = make_attempt(job, cluster, pool, gpus=0)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        placement={"nodes": ["cpu-0", "cpu-1"], "gpus_per_node": 0, "cpu_milli": 3000, "memory_mib": 1024})
    return quota


def test_the_team_page_and_dashboard_show_a_cpu_quota_and_its_use_in_vcpus(owner_web, cpu_quota):
    team_page = owner_web.get("/teams/alpha/").content.decode()
    assert "<td>CPU</td><td>any</td><td>8 vCPUs</td><td>4</td>" in team_page

    dashboard = owner_web.get("/").content.decode()
    assert "<td>alpha</td><td>CPU</td><td>6 vCPUs</td><td>8</td><td>4</td><td>0</td>" in dashboard
    assert 'aria-label="6 of 8 vCPUs"' in dashboard  # reachable: 8 + nothing the cohort lends


def test_staff_edit_a_cpu_quota_in_vcpus_and_it_is_audited(staff, cpu_quota):
    staff_web = signed_in(staff)
    url = f"/teams/alpha/quotas/{cpu_quota.pk}/edit/"
    form = staff_web.get(url).content.decode()
    assert 'name="nominal_vcpus"' in form and 'name="nominal_gpus"' not in form

    bad = staff_web.post(url, {"nominal_vcpus": "16", "borrowing_limit_vcpus": "0", "lending_limit_vcpus": "20",
                               "max_vcpus_per_job": "0"})
    assert bad.status_code == 200 and "at most the nominal quota (16)" in bad.content.decode()
    cpu_quota.refresh_from_db()
    assert cpu_quota.nominal_vcpus == 8

    ok = staff_web.post(url, {"nominal_vcpus": "16", "borrowing_limit_vcpus": "2", "lending_limit_vcpus": "",
                              "max_vcpus_per_job": "4"})
    assert ok.status_code == 302
    cpu_quota.refresh_from_db()
    assert (cpu_quota.nominal_vcpus, cpu_quota.borrowing_limit_vcpus, cpu_quota.max_vcpus_per_job) == (16, 2, 4)
    event = AuditRecord.objects.get(object_type="quota", object_id=cpu_quota.pk)
    assert (event.before["nominal_vcpus"], event.after["nominal_vcpus"]) == (8, 16)
