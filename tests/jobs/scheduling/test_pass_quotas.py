"""The scheduling pass against the database: quota, budget, placement by price, release, priority.

Prices are cluster overrides picked here (USD per GPU-hour), so every
expected estimate is worked out in the test with Decimal arithmetic.
"""

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from costs.ledger import accrue_attempt
from jobs.lifecycle import cancel_job, end_attempt, recover_or_fail
from jobs.models import Job, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from tests.conftest import fresh, run
from quotas.models import Budget, Quota
from runners.models import Cluster

S = JobState
D = Decimal

pytestmark = pytest.mark.django_db


def live_attempt(job):
    return JobAttempt.objects.get(job=job, ended_at__isnull=True)


def state_events(job):
    return list(JobEvent.objects.filter(job=job, kind="state").values_list("from_state", "to_state"))


# --- quota -------------------------------------------------------------------

def test_it_admits_within_nominal_plus_borrowing_and_queues_the_rest_with_the_numbers(
        cluster_factory, quota_factory, h100, alpha, beta, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, gpus_per_node=8, price="6.88")  # 32 GPUs
    quota_factory(alpha, h100, nominal=8, borrowing=4)  # limit 12
    quota_factory(beta, h100, nominal=8)  # idle: the cohort lends alpha the 4 it borrows (issue 4)
    a = submit(alpha, 8)
    b = submit(alpha, 4)
    c = submit(alpha, 1)

    result = schedule_pending()

    assert result.admitted == [a.pk, b.pk] and result.waiting == 1
    assert fresh(a).state == S.ADMITTED and fresh(b).state == S.ADMITTED
    c = fresh(c)
    assert c.state == S.QUEUED
    info = c.queue_info
    assert info["reason"] == "quota"
    assert (info["request_gpus"], info["used_gpus"], info["nominal_gpus"], info["borrowing_limit_gpus"]) == (1, 12, 8, 4)
    assert not c.attempts.exists()


def test_a_waiting_job_gets_one_waiting_event_not_one_per_pass(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    submit(alpha, 8)
    waiting = submit(alpha, 8)
    for _ in range(3):
        schedule_pending()
    assert fresh(waiting).state == S.QUEUED
    assert JobEvent.objects.filter(job=waiting, kind="waiting").count() == 1


def test_a_burst_of_waiting_jobs_gets_one_event_each_and_a_job_that_changed_meanwhile_none(
        cluster_factory, quota_factory, h100, submit):
    """Waiting events are written in bulk, but only for jobs still in the state the pass read (compare and set)."""
    from jobs.scheduling.core import FairShareScheduler
    from jobs.scheduling.passes import run_pass
    from jobs.scheduling.snapshot import load_snapshot
    from quotas.models import Team

    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    teams = [Team.objects.create(slug=f"t{i}", name=f"T{i}") for i in range(12)]
    heads = []
    for team in teams:
        quota_factory(team, h100, nominal=1)
        submit(team, 1)  # admitted: the team's quota is then full
        heads.append(submit(team, 1))  # waits for quota, at the head of its team's queue
        submit(team, 1)  # waits behind it (reason "priority": no event)
    now = timezone.now()
    loaded = load_snapshot(now)
    decisions = FairShareScheduler(loaded.snapshot).full_pass()
    cancelled = heads[7]
    Job.objects.filter(pk=cancelled.pk).update(state=S.CANCELLED)  # cancelled between the read and the write

    run_pass(loaded, decisions, now)

    for job in heads:
        events = JobEvent.objects.filter(job=job, kind="waiting")
        if job == cancelled:
            assert not events.exists() and fresh(job).queue_info == {}
        else:
            assert events.count() == 1 and fresh(job).queue_info["reason"] == "quota"
            assert (events.get().from_state, events.get().to_state) == (S.QUEUED, S.QUEUED)
    assert JobEvent.objects.filter(kind="waiting").count() == len(heads) - 1


def test_a_per_cluster_quota_caps_the_team_there_and_the_rest_goes_elsewhere(
        cluster_factory, quota_factory, h100, alpha, submit):
    cheap, _ = cluster_factory("cheap", "aws", "us-east-1", h100, nodes=2, price="4.00")
    dear, _ = cluster_factory("dear", "gcp", "us-central1", h100, nodes=2, price="6.00")
    quota_factory(alpha, h100, nominal=64)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=cheap, nominal_gpus=8)
    Quota.objects.create(team=alpha, accelerator=h100, cluster=dear, nominal_gpus=4, borrowing_limit_gpus=4)
    a, b, c = submit(alpha, 8), submit(alpha, 8), submit(alpha, 8)

    schedule_pending()

    assert live_attempt(a).cluster == cheap and live_attempt(b).cluster == dear
    c = fresh(c)
    assert c.state == S.QUEUED and c.queue_info["reason"] == "quota"
    assert "cheap" in c.queue_info["message"] and "dear" in c.queue_info["message"]


def test_the_locked_recheck_refuses_a_placement_a_new_per_cluster_quota_forbids(
        cluster_factory, quota_factory, h100, alpha, submit):
    """The pass decided on a snapshot; a per-cluster quota created meanwhile is enforced when it commits."""
    from jobs.scheduling.core import FairShareScheduler
    from jobs.scheduling.passes import run_pass
    from jobs.scheduling.snapshot import load_snapshot

    cheap, _ = cluster_factory("cheap", "aws", "us-east-1", h100, nodes=2, price="4.00")
    quota_factory(alpha, h100, nominal=16)
    job = submit(alpha, 8)
    now = timezone.now()
    loaded = load_snapshot(now)
    decisions = FairShareScheduler(loaded.snapshot).full_pass()
    assert len(decisions.admissions) == 1
    Quota.objects.create(team=alpha, accelerator=h100, cluster=cheap, nominal_gpus=4)

    result = run_pass(loaded, decisions, now)

    assert result.admitted == [] and fresh(job).state == S.QUEUED
    assert fresh(job).queue_info["reason"] == "quota" and not job.attempts.exists()


def test_a_pass_sees_every_change_to_the_queue_since_the_last_one(cluster_factory, quota_factory, h100, alpha, submit):
    """Passes re-read only rows whose version changed: a new job, a changed priority, a job gone, all seen."""
    cluster_factory("big", "aws", "us-east-1", h100, nodes=1, price="6.88")  # room for one 8-GPU job
    quota_factory(alpha, h100, nominal=16)
    running = submit(alpha, 8)
    first, second = submit(alpha, 8), submit(alpha, 8)
    schedule_pending()  # admits `running`; caches the two waiting rows
    assert fresh(running).state == S.ADMITTED
    gone, urgent = submit(alpha, 8, priority=900), submit(alpha, 8)
    Job.objects.filter(pk=gone.pk).update(state=S.CANCELLED)  # left the queue behind the cache's back
    Job.objects.filter(pk=urgent.pk).update(priority=1000)  # changed behind the cache's back
    Job.objects.filter(pk=second.pk).update(priority=950)
    job, attempt = run(running)
    end_attempt(job, attempt, S.SUCCEEDED, reason="done", end_reason="succeeded")

    schedule_pending()

    assert fresh(urgent).state == S.ADMITTED  # highest priority now, though cached at the default one
    assert fresh(gone).state == S.CANCELLED and not fresh(gone).attempts.exists()
    assert fresh(second).queue_info["position"]["team"] == 1  # 950 before first's 500
    assert fresh(first).queue_info["position"]["team"] == 2


def test_a_team_without_quota_for_the_accelerator_is_rejected(cluster_factory, quota_factory, catalog, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, price="6.88")
    quota_factory(alpha, catalog["A100-80GB"], nominal=64)  # quota, but for another accelerator
    job = submit(alpha, 1)
    result = schedule_pending()
    assert result.rejected == 1
    assert fresh(job).state == S.REJECTED
    assert state_events(job) == [("QUEUED", "REJECTED")]
    assert not job.attempts.exists()


def test_a_job_over_the_per_job_cap_is_rejected_and_one_at_the_cap_admitted(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=32, max_per_job=8)
    over = submit(alpha, 8, nodes=2)  # 16 GPUs
    at_cap = submit(alpha, 8)
    schedule_pending()
    assert fresh(over).state == S.REJECTED
    assert fresh(at_cap).state == S.ADMITTED


def test_a_job_over_the_per_job_cap_is_rejected_even_while_a_smaller_job_waits_for_quota(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8, max_per_job=4)
    first, second = submit(alpha, 4), submit(alpha, 4)  # 8 of 8 in use
    small = submit(alpha, 2)  # fits the cap, waits for quota
    over_cap = submit(alpha, 8)  # within the team's limit of 8 but over the cap of 4: can never run
    result = schedule_pending()
    assert result.admitted == [first.pk, second.pk]
    assert fresh(small).state == S.QUEUED and fresh(small).queue_info["reason"] == "quota"
    assert fresh(over_cap).state == S.REJECTED


def test_a_job_over_the_team_limit_is_rejected_even_while_a_smaller_job_waits_for_quota(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8, borrowing=4)
    first = submit(alpha, 8)
    small = submit(alpha, 8)  # 8 + 8 > 12: waits
    over_limit = submit(alpha, 8, nodes=2)  # 16 > 12: can never run
    schedule_pending()
    assert fresh(first).state == S.ADMITTED
    assert fresh(small).state == S.QUEUED
    assert fresh(over_limit).state == S.REJECTED


# --- placement ---------------------------------------------------------------

def test_it_places_on_the_cheapest_cluster_with_room_and_estimates_at_that_price(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("dear", "azure", "eastus", h100, nodes=2, gpus_per_node=8, price="12.29")
    _, cheap_pool = cluster_factory("cheap", "gcp", "us-central1", h100, nodes=1, gpus_per_node=8, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=64)
    jobs = [submit(alpha, 8, max_runtime=5400) for _ in range(5)]

    schedule_pending()

    placed = [fresh(j) for j in jobs]
    clusters = [j.current_attempt.cluster.name if j.current_attempt else None for j in placed]
    # cheap fills first (8 GPUs), then mid (8), then dear (16), then nothing is left
    assert clusters == ["cheap", "mid", "dear", "dear", None]
    # 8 GPUs x 5400 s / 3600 x price: 8 x 1.5 x 4.20 = 50.40; x 6.88 = 82.56; x 12.29 = 147.48
    expected = [D(8) * D(5400) / D(3600) * D(p) for p in ("4.20", "6.88", "12.29", "12.29")]
    assert expected == [D("50.40"), D("82.56"), D("147.48"), D("147.48")]
    assert [j.estimated_cost_usd for j in placed[:4]] == expected
    assert [j.current_attempt.usd_per_gpu_hour for j in placed[:4]] == [D("4.20"), D("6.88"), D("12.29"), D("12.29")]
    last = placed[4]
    assert last.state == S.QUEUED and last.queue_info["reason"] == "capacity"
    assert last.queue_info["request_gpus"] == 8
    assert last.queue_info["free_gpus_by_pool"][str(cheap_pool.pk)] == 0


def test_a_cluster_price_override_beats_the_catalog(cluster_factory, quota_factory, h100, alpha, submit):
    # catalog: aws us-east-1 H100 6.88, gcp us-central1 4.20; the aws cluster's override makes it cheaper
    cluster_factory("gke", "gcp", "us-central1", h100)
    cluster_factory("eks", "aws", "us-east-1", h100, price="3.99")
    quota_factory(alpha, h100, nominal=8)
    job = submit(alpha, 2)
    schedule_pending()
    job = fresh(job)
    assert job.current_attempt.cluster.name == "eks"
    assert job.estimated_cost_usd == D(2) * D(3600) / D(3600) * D("3.99")


def test_spot_pools_only_take_preemptible_jobs(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("spot", "gcp", "us-central1", h100, capacity_type="spot", price="2.99")
    cluster_factory("ondemand", "aws", "us-east-1", h100, price="6.88")
    quota_factory(alpha, h100, nominal=32)
    steady = submit(alpha, 4)
    cheap = submit(alpha, 4, preemptible=True)
    schedule_pending()
    assert fresh(steady).current_attempt.cluster.name == "ondemand"
    assert fresh(cheap).current_attempt.cluster.name == "spot"


def test_placement_constraints_of_the_spec_are_obeyed_even_when_dearer(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, price="6.88")
    cluster_factory("dear", "azure", "eastus", h100, price="12.29")
    quota_factory(alpha, h100, nominal=64)
    by_name = submit(alpha, 1, placement={"clusters": ["dear"]})
    by_provider = submit(alpha, 1, placement={"providers": ["aws", "azure"]})
    by_region = submit(alpha, 1, placement={"regions": ["eastus"]})
    nowhere = submit(alpha, 1, placement={"providers": ["oci"]})
    schedule_pending()
    assert fresh(by_name).current_attempt.cluster.name == "dear"
    assert fresh(by_provider).current_attempt.cluster.name == "mid"
    assert fresh(by_region).current_attempt.cluster.name == "dear"
    nowhere = fresh(nowhere)
    assert nowhere.state == S.QUEUED and nowhere.queue_info["reason"] == "capacity"


def test_unhealthy_clusters_get_no_jobs(cluster_factory, quota_factory, h100, alpha, submit):
    cheap, _ = cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    cluster_factory("mid", "aws", "us-east-1", h100, price="6.88")
    Cluster.objects.filter(pk=cheap.pk).update(health=Cluster.Health.UNREACHABLE)
    quota_factory(alpha, h100, nominal=8)
    job = submit(alpha, 1)
    schedule_pending()
    assert fresh(job).current_attempt.cluster.name == "mid"


def test_a_node_shape_the_pool_lacks_waits_even_with_enough_free_gpus(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("fours", "aws", "us-east-1", h100, nodes=4, gpus_per_node=4, price="6.88")  # 16 GPUs
    quota_factory(alpha, h100, nominal=16)
    eights = submit(alpha, 8)  # needs a node with 8 GPUs
    fours = submit(alpha, 4, nodes=2)
    schedule_pending()
    assert fresh(eights).state == S.QUEUED and fresh(eights).queue_info["reason"] == "capacity"
    assert fresh(fours).state == S.ADMITTED


# --- the admitted job --------------------------------------------------------

def test_an_admitted_job_has_one_attempt_named_after_it_and_an_admitted_event(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster, pool = cluster_factory("mid", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=16)
    job = submit(alpha, 8, nodes=2)

    schedule_pending()

    job = fresh(job)
    assert job.state == S.ADMITTED and job.admitted_at is not None
    attempts = list(job.attempts.all())
    assert len(attempts) == 1
    attempt = attempts[0]
    assert attempt.number == 1
    assert attempt.object_name == f"job-{job.pk}-1"
    assert attempt.gpus == 16
    assert (attempt.cluster_id, attempt.node_pool_id) == (cluster.pk, pool.pk)
    assert attempt.started_at is None and attempt.ended_at is None
    assert job.current_attempt_id == attempt.pk
    events = list(JobEvent.objects.filter(job=job, kind="state"))
    assert [(e.from_state, e.to_state, e.attempt_id) for e in events] == [("QUEUED", "ADMITTED", attempt.pk)]
    # 16 GPUs x 1 h x 6.88
    assert job.estimated_cost_usd == D(16) * D("6.88")


def test_admission_clears_the_queue_reason(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("mid", "aws", "us-east-1", h100, nodes=1, price="6.88")
    quota_factory(alpha, h100, nominal=16)
    first = submit(alpha, 8)
    second = submit(alpha, 8)
    schedule_pending()
    assert fresh(second).queue_info["reason"] == "capacity"
    job, attempt = run(first)
    end_attempt(job, attempt, S.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    schedule_pending()
    second = fresh(second)
    assert second.state == S.ADMITTED and second.queue_info == {}


def test_a_recovering_job_is_admitted_again_with_a_second_attempt(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("mid", "aws", "us-east-1", h100, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    job = submit(alpha, 8, max_retries=1)
    schedule_pending()
    job, attempt = run(job)
    recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.PREEMPTED)
    assert fresh(job).state == S.RECOVERING

    schedule_pending()

    job = fresh(job)
    assert job.state == S.ADMITTED
    assert [a.object_name for a in job.attempts.order_by("number")] == [f"job-{job.pk}-1", f"job-{job.pk}-2"]
    assert job.current_attempt.number == 2 and job.current_attempt.ended_at is None
    assert JobAttempt.objects.get(job=job, number=1).ended_at is not None
    assert state_events(job) == [("QUEUED", "ADMITTED"), ("ADMITTED", "STARTING"), ("STARTING", "RUNNING"),
                                 ("RUNNING", "RECOVERING"), ("RECOVERING", "ADMITTED")]


# --- release, quota changes, priority ----------------------------------------

def test_an_ended_attempt_releases_its_gpus_to_the_next_waiting_job(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    first = submit(alpha, 8)
    second = submit(alpha, 8)
    schedule_pending()
    assert fresh(second).state == S.QUEUED and fresh(second).queue_info["used_gpus"] == 8

    job, attempt = run(first)
    schedule_pending()  # still running: nothing released
    assert fresh(second).state == S.QUEUED

    end_attempt(job, attempt, S.SUCCEEDED, reason="done", end_reason=JobAttempt.EndReason.SUCCEEDED, exit_code=0)
    result = schedule_pending()
    assert result.admitted == [second.pk]
    assert fresh(second).state == S.ADMITTED


def test_an_ended_attempt_releases_cluster_capacity_too(cluster_factory, quota_factory, h100, alpha, beta, submit):
    _, pool = cluster_factory("small", "aws", "us-east-1", h100, nodes=1, gpus_per_node=8, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    quota_factory(beta, h100, nominal=8)
    first = submit(alpha, 8)
    other_team = submit(beta, 8)
    schedule_pending()
    assert fresh(other_team).queue_info["reason"] == "capacity"
    assert fresh(other_team).queue_info["free_gpus_by_pool"] == {str(pool.pk): 0}
    job = fresh(first)
    end_attempt(job, job.current_attempt, S.FAILED, reason="dispatch failed",
                end_reason=JobAttempt.EndReason.DISPATCH_ERROR)  # ADMITTED -> FAILED
    schedule_pending()
    assert fresh(other_team).state == S.ADMITTED
    assert fresh(other_team).current_attempt.node_pool_id == pool.pk


def test_a_quota_lowered_below_use_leaves_running_jobs_alone_but_stops_new_admissions(
        cluster_factory, quota_factory, h100, alpha, beta, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota = quota_factory(alpha, h100, nominal=8, borrowing=4)
    quota_factory(beta, h100, nominal=8)  # idle: the cohort lends alpha the 4 it borrows (issue 4)
    a = submit(alpha, 8)
    b = submit(alpha, 4)
    schedule_pending()
    run(a)
    Quota.objects.filter(pk=quota.pk).update(nominal_gpus=4, borrowing_limit_gpus=0)
    small = submit(alpha, 1)
    too_big = submit(alpha, 8)  # over the new limit of 4: can never run now

    schedule_pending()

    assert fresh(a).state == S.RUNNING and fresh(b).state == S.ADMITTED
    assert JobAttempt.objects.filter(job__in=[a, b], ended_at__isnull=True).count() == 2
    small = fresh(small)
    assert small.state == S.QUEUED and small.queue_info["reason"] == "quota"
    assert (small.queue_info["used_gpus"], small.queue_info["nominal_gpus"], small.queue_info["borrowing_limit_gpus"]) == (12, 4, 0)
    assert fresh(too_big).state == S.REJECTED


def test_a_high_priority_job_submitted_later_is_admitted_first_when_only_one_fits(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    normal = submit(alpha, 8, priority=500)
    high = submit(alpha, 8, priority=1000)
    assert normal.created_at < high.created_at
    result = schedule_pending()
    assert result.admitted == [high.pk]
    assert fresh(high).state == S.ADMITTED and fresh(normal).state == S.QUEUED


def test_equal_priority_goes_in_submission_order(cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    jobs = [submit(alpha, 8) for _ in range(3)]
    assert schedule_pending().admitted == [jobs[0].pk]


# --- budgets -----------------------------------------------------------------

def test_a_block_budget_keeps_the_job_that_does_not_fit_queued(
        cluster_factory, quota_factory, budget_factory, h100, alpha, submit):
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=4, price="4.20")
    quota_factory(alpha, h100, nominal=32)
    budget_factory(alpha, "100.00", action="block")
    jobs = [submit(alpha, 8) for _ in range(3)]  # 8 GPUs x 1 h x 4.20 = 33.60 each

    result = schedule_pending()

    assert result.admitted == [jobs[0].pk, jobs[1].pk]
    third = fresh(jobs[2])
    assert third.state == S.QUEUED
    info = third.queue_info
    assert info["reason"] == "budget"
    assert D(info["estimate_usd"]) == D(8) * D("4.20")  # 33.60
    assert D(info["committed_usd"]) == 2 * D(8) * D("4.20")  # 67.20
    assert D(info["remaining_usd"]) == D("100.00") - 2 * D(8) * D("4.20")  # 32.80
    assert D(info["amount_usd"]) == D("100.00")


def test_an_estimate_over_the_whole_block_budget_is_rejected(
        cluster_factory, quota_factory, budget_factory, h100, alpha, submit):
    cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    budget_factory(alpha, "30.00", action="block")
    job = submit(alpha, 8)  # 33.60 > 30.00
    assert schedule_pending().rejected == 1
    job = fresh(job)
    assert job.state == S.REJECTED and not job.attempts.exists()
    assert state_events(job) == [("QUEUED", "REJECTED")]
    assert job.estimated_cost_usd == D(8) * D("4.20")  # the estimate the budget refused, kept on the job


def test_an_alert_budget_admits_over_its_amount(cluster_factory, quota_factory, budget_factory, h100, alpha, submit):
    cluster_factory("cheap", "gcp", "us-central1", h100, price="4.20")
    quota_factory(alpha, h100, nominal=8)
    budget_factory(alpha, "10.00", action="alert")
    job = submit(alpha, 8)
    schedule_pending()
    assert fresh(job).state == S.ADMITTED


def test_a_job_that_would_fit_the_budget_at_the_cheapest_price_waits_instead_of_being_rejected(
        cluster_factory, quota_factory, budget_factory, h100, alpha, beta, submit):
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=1, price="4.20")
    cluster_factory("dear", "azure", "eastus", h100, nodes=1, price="12.29")
    quota_factory(alpha, h100, nominal=8)
    quota_factory(beta, h100, nominal=8)
    budget_factory(alpha, "50.00", action="block")
    squatter = submit(beta, 8)  # takes the cheap cluster
    schedule_pending()
    assert fresh(squatter).current_attempt.cluster.name == "cheap"

    job = submit(alpha, 8)  # dear: 8 x 12.29 = 98.32 > 50 (all that is free); cheap: 33.60 <= 50
    schedule_pending()
    job = fresh(job)
    assert job.state == S.QUEUED and job.queue_info["reason"] == "budget"
    assert D(job.queue_info["estimate_usd"]) == D(8) * D("12.29")

    squatter = fresh(squatter)
    end_attempt(squatter, squatter.current_attempt, S.FAILED, reason="x", end_reason=JobAttempt.EndReason.DISPATCH_ERROR)
    schedule_pending()
    job = fresh(job)
    assert job.state == S.ADMITTED and job.current_attempt.cluster.name == "cheap"
    assert job.estimated_cost_usd == D(8) * D("4.20")


def test_money_spent_in_the_ledger_and_committed_by_running_jobs_both_count(
        cluster_factory, quota_factory, h100, alpha, submit):
    cluster_factory("cheap", "gcp", "us-central1", h100, nodes=3, price="4.20")
    quota_factory(alpha, h100, nominal=24)
    now = timezone.now()
    Budget.objects.create(team=alpha, period="custom", starts_at=now - dt.timedelta(days=1),
                          ends_at=now + dt.timedelta(days=1), amount_usd=D("100.00"), action="block")
    first = submit(alpha, 8)  # estimate 8 x 1 h x 4.20 = 33.60
    schedule_pending()
    job, attempt = run(first)
    t0 = now - dt.timedelta(hours=1)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=t0)
    accrue_attempt(attempt.pk, until=t0 + dt.timedelta(minutes=30))  # 8 x 0.5 h x 4.20 = 16.80 spent
    # remaining = 100 - 16.80 spent - (33.60 - 16.80) committed = 66.40
    two_hours = submit(alpha, 8, max_runtime=7200)  # 8 x 2 x 4.20 = 67.20 > 66.40: waits (not over the whole 100)
    schedule_pending()
    two_hours = fresh(two_hours)
    assert two_hours.state == S.QUEUED and two_hours.queue_info["reason"] == "budget"
    assert D(two_hours.queue_info["spent_usd"]) == D("16.80")
    assert D(two_hours.queue_info["committed_usd"]) == D("16.80")
    assert D(two_hours.queue_info["remaining_usd"]) == D("66.40")

    ninety_minutes = submit(alpha, 8, max_runtime=5400)  # 8 x 1.5 x 4.20 = 50.40 <= 66.40
    schedule_pending()
    # issue 4: a team's own jobs keep their order, so it waits behind two_hours although it would fit
    ninety = fresh(ninety_minutes)
    assert ninety.state == S.QUEUED and ninety.queue_info["reason"] == "priority"
    assert ninety.queue_info["behind_job_id"] == two_hours.pk
    cancel_job(fresh(two_hours))
    schedule_pending()
    assert fresh(ninety_minutes).state == S.ADMITTED


def test_preemptions_do_not_use_up_retries_but_losses_do(cluster_factory, quota_factory, h100, alpha, submit):
    from jobs.lifecycle import preempt_attempt

    cluster_factory("big", "aws", "us-east-1", h100, nodes=4, price="6.88")
    quota_factory(alpha, h100, nominal=8)
    job = submit(alpha, 4, max_retries=1)

    schedule_pending()
    job, attempt = run(job)
    preempt_attempt(job, attempt, reason="preempted for a team within its nominal quota")
    schedule_pending()
    job, attempt = run(job)
    assert attempt.number == 2
    recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST)
    assert fresh(job).state == S.RECOVERING  # the preemption did not count: one retry was left

    schedule_pending()
    job, attempt = run(job)
    assert attempt.number == 3
    recover_or_fail(job, attempt, end_reason=JobAttempt.EndReason.NODE_LOST)
    assert fresh(job).state == S.FAILED  # the one retry went to the loss of attempt 2
