"""``check_cpu_quota``: the CPU quota rule in millicores, told in vCPUs; no CPU quota is quota-free."""

from __future__ import annotations

from jobs.scheduling.core import QueuedJob, QuotaView, check_cpu_quota
from jobs.scheduling.core.rules import quota_verdict


def test_without_a_cpu_quota_any_cpu_request_is_within_it():
    assert check_cpu_quota(512_000, 10_000_000, None).ok


def test_within_nominal_plus_borrowing_is_admitted_and_one_millicore_more_waits():
    quota = QuotaView(8000, 2000)  # 8 + 2 vCPUs
    assert check_cpu_quota(2500, 7500, quota).ok  # exactly 10
    verdict = check_cpu_quota(2501, 7500, quota)
    assert (verdict.ok, verdict.never, verdict.reason) == (False, False, "quota")
    assert verdict.message == ("Over CPU quota: 7.5 of 10 vCPUs in use; 2.501 more would exceed the team's CPU limit "
                               "of 10 vCPUs (nominal 8 + borrowing limit 2)")
    assert (verdict.detail["request_vcpus"], verdict.detail["used_vcpus"], verdict.detail["limit_vcpus"]) == \
        (2.501, 7.5, 10)


def test_over_the_reachable_limit_or_the_per_job_cap_it_can_never_run():
    capped = check_cpu_quota(5000, 0, QuotaView(8000, 8000, 4000))
    assert capped.never and "per-job cap of 4 vCPUs" in capped.message
    unreachable = check_cpu_quota(9000, 0, QuotaView(8000, 8000, 0, reachable_gpus=8500))
    assert unreachable.never
    assert "the 8.5 vCPUs the team can reach (nominal 8 + 0.5 its cohort can lend" in unreachable.message


def test_a_gpu_job_is_judged_by_the_gpu_rule_and_a_cpu_only_job_by_the_cpu_rule():
    gpu_job = QueuedJob(1, 1, 1, nodes=1, gpus_per_node=8)
    cpu_job = QueuedJob(2, 1, 2, nodes=1, gpus_per_node=0, cpu_milli=8000)
    assert "GPUs" in quota_verdict(gpu_job, 8, 0, QuotaView(4)).message
    assert quota_verdict(cpu_job, 8000, 0, QuotaView(4000)).message.startswith("Over CPU quota")
