"""CPU quotas in the scheduling pass against the database (ADR 0012): a team without one runs CPU-only jobs
quota-free; a team with one is admitted while the vCPUs its CPU-only jobs' pods request (nodes x replicas x cpu)
stay within nominal + borrowing limit, the rest waits with reason ``quota`` and the numbers in vCPUs; borrowing
is capped by what the cohort's other teams can lend, and their lent nominal is then not theirs to use.

The CPU pool: gcp-usc1, 4 nodes of 16 cores and 64 GiB, at the seeded CPU catalog price.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from quotas.models import Quota
from tests.support.factories import fresh, make_job_row

S = JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def cpu_job(cpu, user):
    """``cpu_job(team, cpu, nodes=1, replicas=1)``: a QUEUED CPU-only job of ``nodes`` x ``replicas`` pods of
    ``cpu`` cores and 1 GiB each (an inference job when ``replicas`` > 1)."""
    names = iter(range(1, 1000))

    def make(team, cores, nodes=1, replicas=1):
        spec = {"image": "python:3.11", "command": ["python", "prep.py"],
                "resources": {"accelerator": "CPU", "gpus_per_node": 0, "nodes": nodes, "cpu": cores,
                              "memory_gib": 1},
                "priority": "normal", "max_runtime_seconds": 3600, "preemptible": False, "placement": {},
                "max_retries": 0}
        kind = "training"
        if replicas > 1:
            spec.update(replicas=replicas, port=8000)
            kind = "inference"
        return make_job_row(team, user, cpu, name=f"cpu-{next(names)}", kind=kind, gpus_per_node=0, nodes=nodes,
                            spec=spec)
    return make


def cpu_quota(team, flavor, nominal, borrowing=0, max_per_job=0, lending=None) -> Quota:
    return Quota.objects.create(team=team, accelerator=flavor, nominal_vcpus=nominal, borrowing_limit_vcpus=borrowing,
                                max_vcpus_per_job=max_per_job, lending_limit_vcpus=lending)


def held_vcpus(team) -> float:
    """vCPUs the team's live attempts hold, from what admission recorded (cpu per pod x pods)."""
    total = 0
    for placement in JobAttempt.objects.filter(job__team=team, ended_at__isnull=True).values_list("placement",
                                                                                                  flat=True):
        total += placement["cpu_milli"] * len(placement["nodes"])
    return total / 1000


def rejected_because(job) -> str:
    return JobEvent.objects.get(job=job, to_state=S.REJECTED).reason


def test_a_team_without_a_cpu_quota_runs_cpu_only_jobs_quota_free(cpu, cpu_job, alpha):
    jobs = [cpu_job(alpha, 16, nodes=2), cpu_job(alpha, 16, nodes=2)]  # 64 vCPUs: the whole pool

    result = schedule_pending()

    assert sorted(result.admitted) == sorted(j.pk for j in jobs)
    assert all(fresh(j).state == S.ADMITTED for j in jobs)
    assert held_vcpus(alpha) == 4 * 16


def test_a_cpu_quota_admits_within_it_and_the_rest_waits_over_cpu_quota_with_the_numbers(cpu, cpu_job, alpha):
    cpu_quota(alpha, cpu, nominal=8)
    serving = cpu_job(alpha, 3, replicas=2)  # 2 pods x 3 cores = 6 vCPUs
    big = cpu_job(alpha, 4)  # 6 + 4 = 10 > 8
    small = cpu_job(alpha, 2)  # 6 + 2 = 8: fits (BestEffortFIFO passes the one that waits)

    result = schedule_pending()

    assert result.admitted == [serving.pk, small.pk]
    assert held_vcpus(alpha) == 8
    waiting = fresh(big)
    assert waiting.state == S.QUEUED
    info = waiting.queue_info
    assert info["reason"] == "quota"
    assert info["message"].startswith("Over CPU quota: 6 of 8 vCPUs in use; 4 more would exceed the team's CPU "
                                      "limit of 8 vCPUs (nominal 8 + borrowing limit 0)")
    assert (info["request_vcpus"], info["used_vcpus"], info["nominal_vcpus"], info["limit_vcpus"]) == (4, 6, 8, 8)

    JobAttempt.objects.filter(job=serving).update(ended_at=timezone.now())  # its 6 vCPUs are given back
    assert schedule_pending().admitted == [big.pk]


def test_a_fractional_cpu_request_counts_its_millicores(cpu, cpu_job, alpha):
    cpu_quota(alpha, cpu, nominal=1)
    first, second, third = cpu_job(alpha, 0.5), cpu_job(alpha, 0.5), cpu_job(alpha, 0.5)

    assert schedule_pending().admitted == [first.pk, second.pk]
    info = fresh(third).queue_info
    assert (info["request_vcpus"], info["used_vcpus"], info["limit_vcpus"]) == (0.5, 1, 1)


def test_borrowing_is_capped_by_what_the_cohort_lends_and_the_lender_then_waits(cpu, cpu_job, alpha, beta):
    cpu_quota(alpha, cpu, nominal=4, borrowing=4)  # limit 8, but beta lends only its 2
    cpu_quota(beta, cpu, nominal=2)
    a1, a2, a3 = cpu_job(alpha, 4), cpu_job(alpha, 2), cpu_job(alpha, 1)

    assert schedule_pending().admitted == [a1.pk, a2.pk]  # 4 nominal + 2 borrowed from beta
    info = fresh(a3).queue_info
    assert info["reason"] == "quota"
    assert "the 6 vCPUs the team can reach (nominal 4 + 2 its cohort can lend" in info["message"]
    assert info["limit_vcpus"] == 6

    b1 = cpu_job(beta, 2)  # beta's nominal is lent to alpha: the cohort's 6 are in use
    schedule_pending()
    info = fresh(b1).queue_info
    assert fresh(b1).state == S.QUEUED and info["reason"] == "quota"
    assert info["message"] == ("Over CPU quota: the cohort's shared pool holds 6 vCPUs and 6 of them are in use; 2 more "
                               "do not fit")


def test_a_lending_limit_keeps_the_lenders_vcpus_for_itself(cpu, cpu_job, alpha, beta):
    cpu_quota(alpha, cpu, nominal=4, borrowing=4)
    cpu_quota(beta, cpu, nominal=4, lending=1)  # beta keeps 3 of its 4
    a1, a2 = cpu_job(alpha, 4), cpu_job(alpha, 2)  # alpha can reach 4 + 1 = 5
    b1 = cpu_job(beta, 3)

    result = schedule_pending()

    assert sorted(result.admitted) == sorted([a1.pk, b1.pk])
    assert fresh(a2).queue_info["limit_vcpus"] == 5


def test_cpu_only_jobs_over_the_per_job_cap_or_the_reachable_limit_are_rejected(cpu, cpu_job, alpha):
    cpu_quota(alpha, cpu, nominal=8, borrowing=8, max_per_job=10)  # nobody lends: reachable 8
    over_cap = cpu_job(alpha, 11)
    over_limit = cpu_job(alpha, 3, nodes=3)  # 9 vCPUs: within the cap, over the 8 it can reach
    fits = cpu_job(alpha, 6)

    result = schedule_pending()

    assert result.admitted == [fits.pk]
    assert fresh(over_cap).state == S.REJECTED and fresh(over_limit).state == S.REJECTED
    assert "per-job cap of 10 vCPUs" in rejected_because(over_cap)
    assert "the 8 vCPUs the team can reach (nominal 8 + 0 its cohort can lend" in rejected_because(over_limit)


def test_a_cpu_quota_never_limits_gpu_jobs_and_a_gpu_quota_never_limits_cpu_jobs(cpu, cpu_job, alpha, h100,
                                                                                   cluster_factory, quota_factory,
                                                                                   queue_job):
    cluster_factory("aws", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    cpu_quota(alpha, cpu, nominal=2)
    gpu = queue_job(alpha, 8)
    cpu_a, cpu_b = cpu_job(alpha, 2), cpu_job(alpha, 1)

    result = schedule_pending()

    assert sorted(result.admitted) == sorted([gpu.pk, cpu_a.pk])
    assert fresh(cpu_b).queue_info["used_vcpus"] == 2
