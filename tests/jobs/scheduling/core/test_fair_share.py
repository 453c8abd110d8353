"""Each fair-share rule on the pure core (borrowing, cohorts, lending limits, queue order, gangs, budgets,
positions, per-cluster quotas), with the expected admissions worked out by hand in each test.

One accelerator; teams are numbered; GPU counts are whole GPUs; prices USD/GPU-hour.
"""

from decimal import Decimal

from jobs.scheduling.core import FairShareScheduler, TeamState
from tests.support.scheduling import H100, admitted, block_budget, decide, job, pool, running, snapshot, team

# --- borrowing, cohorts, lending limits -----------------------------------------------------

def test_a_team_borrows_the_idle_nominal_quota_of_its_cohort_up_to_its_borrowing_limit():
    a1, a2, a3 = job(1, 8), job(1, 8), job(1, 8)
    # team 1: 8 + 8 borrowing; team 2 lends its idle 8. Limit 16: the third 8 would make 24.
    d, _ = decide([team(1, 8, 8), team(2, 8)], [pool(1, 32)], [a1, a2, a3])
    assert admitted(d) == [a1.job_id, a2.job_id]
    w = d.waiting[a3.job_id]
    assert w.reason == "quota" and (w.detail["used_gpus"], w.detail["nominal_gpus"], w.detail["borrowing_limit_gpus"]) == (16, 8, 8)


def test_a_team_cannot_borrow_more_than_its_cohort_lends():
    a1, a2 = job(1, 8), job(1, 8)
    # cohort nominal 8 + 4 = 12: the team can reach 8 + 4, not the 8 + 16 its borrowing limit says
    d, _ = decide([team(1, 8, 16), team(2, 4)], [pool(1, 32)], [a1, a2])
    assert admitted(d) == [a1.job_id]
    w = d.waiting[a2.job_id]
    assert w.reason == "quota" and (w.detail["used_gpus"], w.detail["limit_gpus"]) == (8, 12)
    assert "12 GPUs the team can reach" in w.message


def test_a_job_over_what_the_cohort_can_ever_lend_is_rejected():
    # nominal 4, borrowing 4 ("limit 8"), the other team lends 2: the team can reach 6, so 2 x 4 never runs
    big = job(1, 4, nodes=2)
    d, _ = decide([team(1, 4, 4), team(2, 2)], [pool(1, 16, gpus_per_node=4)], [big])
    assert [(r.job.job_id, r.verdict.never, r.verdict.detail["limit_gpus"]) for r in d.rejections] == [(big.job_id, True, 6)]


def test_the_cohorts_lendable_pool_is_not_overdrawn_by_borrowers():
    # lendable 4 + 4 + 4 = 12; team 2 borrows 8 of it; team 1 may reach 12 but 8 more would overdraw the pool
    want = job(1, 8)
    runs = [running(71, 2, 8, 1, preemptible=False)]
    d, _ = decide([team(1, 4, 8), team(2, 4, 8), team(3, 4)], [pool(1, 32)], [want], runs)
    w = d.waiting[want.job_id]
    assert w.reason == "quota" and (w.detail["cohort_lendable_gpus"], w.detail["cohort_borrowed_gpus"]) == (12, 8)


def test_teams_of_another_cohort_lend_nothing():
    a1, a2 = job(1, 8), job(1, 8)
    d, _ = decide([team(1, 8, 8, cohort="x"), team(2, 8, cohort="y")], [pool(1, 32)], [a1, a2])
    assert admitted(d) == [a1.job_id]
    assert d.waiting[a2.job_id].reason == "quota"


def test_a_lending_limit_keeps_the_rest_of_the_nominal_quota_from_being_lent():
    # team 2 lends only 2 of its 8: the cohort pool is team 1's 8 + 2 = 10
    a1, a2 = job(1, 8), job(1, 4)
    d, _ = decide([team(1, 8, 8), team(2, 8, lending=2)], [pool(1, 32)], [a1, a2])
    assert admitted(d) == [a1.job_id]  # 8 + 4 = 12 > 10
    b1, b2 = job(1, 8), job(1, 2)
    d, _ = decide([team(1, 8, 8), team(2, 8, lending=2)], [pool(1, 32)], [b1, b2])
    assert admitted(d) == [b1.job_id, b2.job_id]  # 8 + 2 = 10


# --- order: priority, dominant share, weight, submission ----------------------------------------

def test_a_higher_priority_job_of_another_team_goes_first_when_only_one_fits():
    normal, high = job(1, 8, at=1), job(2, 8, priority=1000, at=2)
    d, _ = decide([team(1, 8), team(2, 8)], [pool(1, 8)], [normal, high])
    assert admitted(d) == [high.job_id]
    assert d.waiting[normal.job_id].reason == "capacity"


def _share_scenario(weight_1: float):
    # cohort lendable 4 + 4 + 16 = 24. Team 1 holds 8 (borrows 4: share 4/24), team 2 holds 6 (borrows 2: 2/24),
    # team 3 holds 6 within nominal. 24 - 20 = 4 GPUs left in the pool: one 4-GPU job fits.
    teams = [team(1, 4, 12, weight=weight_1), team(2, 4, 12), team(3, 16)]
    runs = [running(901, 1, 8, 1, preemptible=False), running(902, 2, 6, 1, preemptible=False),
            running(903, 3, 6, 1, preemptible=False)]
    first, second = job(1, 4, at=1), job(2, 4, at=2)
    d, _ = decide(teams, [pool(1, 24, gpus_per_node=4)], [first, second], runs)
    return d, first, second


def test_the_team_with_the_lower_dominant_share_goes_first_even_if_it_submitted_later():
    d, first, second = _share_scenario(1.0)  # 4/24 > 2/24
    assert admitted(d) == [second.job_id]


def test_a_weight_divides_the_dominant_share():
    d, first, second = _share_scenario(3.0)  # (4/24)/3 = 1/18 < 2/24 = 1/12
    assert admitted(d) == [first.job_id]


def test_equal_priority_and_share_go_in_submission_order():
    jobs = [job(1, 8, at=3), job(2, 8, at=1), job(3, 8, at=2)]
    d, _ = decide([team(1, 8), team(2, 8), team(3, 8)], [pool(1, 16)], jobs)
    assert admitted(d) == [jobs[1].job_id, jobs[2].job_id]


# --- best-effort FIFO between teams, strict order within a team ---------------------------------

def test_under_strict_fifo_a_head_that_does_not_fit_blocks_its_own_team_but_not_other_teams():
    # pool of 3 nodes x 8, one node busy: team 1's 24-GPU gang cannot start; team 2's 8 can
    big, small_same_team, other = job(1, 8, nodes=3, at=1), job(1, 4, at=2), job(2, 8, at=3)
    runs = [running(900, 3, 8, 1, preemptible=False)]
    teams = [team(1, 24, strategy="StrictFIFO"), team(2, 8), team(3, 8)]
    d, _ = decide(teams, [pool(1, 24)], [big, small_same_team, other], runs)
    assert admitted(d) == [other.job_id]
    assert d.waiting[big.job_id].reason == "capacity"
    behind = d.waiting[small_same_team.job_id]
    assert behind.reason == "priority" and behind.detail["behind_job_id"] == big.job_id


def test_under_best_effort_fifo_a_smaller_job_passes_a_head_that_does_not_fit():
    big, small_same_team, other = job(1, 8, nodes=3, at=1), job(1, 4, at=2), job(2, 8, at=3)
    runs = [running(900, 3, 8, 1, preemptible=False)]
    d, _ = decide([team(1, 24), team(2, 8), team(3, 8)], [pool(1, 24)], [big, small_same_team, other], runs)
    assert sorted(admitted(d)) == sorted([small_same_team.job_id, other.job_id])
    w = d.waiting[big.job_id]
    assert w.reason == "capacity" and w.team_position == 1
    # the numbers are the pool's after the pass: 24 GPUs less the running 8 and the two admitted jobs' 4 and 8
    free_after = 24 - 8 - small_same_team.total_gpus - other.total_gpus
    assert "3 nodes x 8 GPUs" in w.message and f"{free_after} GPUs free" in w.message
    assert w.detail["free_gpus_by_pool"] == {"1": free_after}


def test_a_job_no_node_pool_can_ever_hold_does_not_block_its_team():
    never, fits = job(1, 16, at=1), job(1, 8, at=2)  # no node has 16 GPUs
    d, _ = decide([team(1, 32)], [pool(1, 16)], [never, fits])
    assert admitted(d) == [fits.job_id]
    assert d.waiting[never.job_id].reason == "capacity" and d.waiting[never.job_id].detail["never_placeable"]


def test_a_gang_is_admitted_whole_or_not_at_all():
    gang = job(1, 4, nodes=4)  # 16 GPUs on one pool of 4-GPU nodes
    d, _ = decide([team(1, 32)], [pool(1, 16, gpus_per_node=4, free=12), pool(2, 16, gpus_per_node=4, free=12)], [gang])
    assert admitted(d) == [] and d.waiting[gang.job_id].reason == "capacity"
    d, _ = decide([team(1, 32)], [pool(1, 16, gpus_per_node=4, free=12), pool(2, 16, gpus_per_node=4)], [gang])
    assert [(a.job.job_id, a.offer.node_pool_id) for a in d.admissions] == [(gang.job_id, 2)]


def test_placement_goes_cheapest_then_tightest_fit_and_spot_only_if_preemptible():
    # pools 2 and 3 cost the same: pool 2's free node is taken whole, and pool 3 stays whole for a 2 x 8 job
    pools = [pool(1, 16, price="6.88"), pool(2, 16, price="4.20", free=8), pool(3, 16, price="4.20"),
             pool(4, 16, price="2.99", capacity_type="spot")]
    steady, cheap = job(1, 8), job(1, 8, preemptible=True)
    d, _ = decide([team(1, 64)], pools, [steady, cheap])
    assert [a.offer.node_pool_id for a in d.admissions] == [2, 4]
    assert d.admissions[0].estimate_usd == Decimal("33.600000")  # 8 GPUs x 1 h x 4.20


# --- budgets and quota changes -----------------------------------------------------------------------

def test_a_block_budget_keeps_jobs_waiting_and_rejects_one_over_the_whole_amount():
    # 8 GPUs x 1 h x 4.00 = 32.00 each; 100.00 holds three. 8 x 4 h x 4.00 = 128.00 can never fit.
    jobs = [job(1, 8) for _ in range(4)]
    huge = job(1, 8, runtime=4 * 3600)
    d, _ = decide([team(1, 64, budgets=[block_budget("100.00")])], [pool(1, 64)], jobs + [huge])
    assert admitted(d) == [j.job_id for j in jobs[:3]]
    w = d.waiting[jobs[3].job_id]
    assert w.reason == "budget" and Decimal(w.detail["remaining_usd"]) == Decimal("100.00") - 3 * Decimal("32.00")
    assert [r.job.job_id for r in d.rejections] == [huge.job_id]


def test_a_quota_lowered_below_use_stops_new_admissions_only():
    runs = [running(61, 1, 8, 1, preemptible=False)]
    small = job(1, 1)
    d, _ = decide([team(1, 4), team(2, 8)], [pool(1, 16)], [small], runs)  # nominal now 4, 8 in use
    assert admitted(d) == [] and d.preemptions == []
    assert d.waiting[small.job_id].reason == "quota" and d.waiting[small.job_id].detail["used_gpus"] == 8


def test_jobs_over_the_cap_or_without_quota_are_rejected_even_behind_a_blocked_head():
    head, capped = job(1, 8), job(1, 8, nodes=2)
    d, _ = decide([team(1, 8, 8, max_per_job=8), team(2, 8)], [pool(1, 8, free=0)], [head, capped])
    assert [r.job.job_id for r in d.rejections] == [capped.job_id]
    stranger = job(3, 1)  # team 3 has no quota for the accelerator
    d, _ = decide([team(1, 8), TeamState(3)], [pool(1, 8)], [stranger])
    assert [(r.job.job_id, r.verdict.reason, r.verdict.never) for r in d.rejections] == [(stranger.job_id, "quota", True)]


# --- positions and the incremental pass ---------------------------------------------------------------

def test_every_waiting_job_has_its_position_in_its_team_and_overall():
    a = [job(1, 8, at=t) for t in (1, 3, 5)]
    b = [job(2, 8, at=t) for t in (2, 4)]
    d, _ = decide([team(1, 8), team(2, 8)], [pool(1, 8, free=0)], a + b)
    assert [(d.waiting[j.job_id].team_position, d.waiting[j.job_id].overall_position) for j in a] == [(1, 1), (2, 3), (3, 5)]
    assert [(d.waiting[j.job_id].team_position, d.waiting[j.job_id].overall_position) for j in b] == [(1, 2), (2, 4)]
    assert d.waiting[a[0].job_id].info()["position"] == {"team": 1, "overall": 1}


def test_the_incremental_pass_decides_a_new_submission_as_a_full_pass_would():
    teams = lambda: [team(1, 8, strategy="StrictFIFO"), team(2, 16)]  # noqa: E731
    queue = [job(1, 8, at=1), job(1, 8, at=2), job(2, 8, at=3)]
    scheduler = FairShareScheduler(snapshot(teams(), [pool(1, 32)], queue))
    d = scheduler.full_pass()
    assert admitted(d) == [queue[0].job_id, queue[2].job_id]
    behind = job(1, 4, at=4)  # team 1 is blocked on its quota: waits behind its head
    inc = scheduler.submit(behind)
    assert inc.admissions == [] and inc.waiting[behind.job_id].reason == "priority"
    assert (inc.waiting[behind.job_id].team_position, inc.waiting[behind.job_id].overall_position) == (2, 2)
    fits = job(2, 8, at=5)  # team 2 has 8 of its 16 left and the pool has 16 free
    inc = scheduler.submit(fits)
    assert admitted(inc) == [fits.job_id]
    full, _ = decide(teams(), [pool(1, 32)], queue + [behind, fits])
    assert admitted(full) == [queue[0].job_id, queue[2].job_id, fits.job_id]



def test_a_submission_that_waits_for_room_is_told_the_room_after_its_pass():
    # one node of 8 GPUs: the full pass admits a 6-GPU job; a later 4-GPU submission waits with 2 free, in the
    # same words as a full pass over both would give it; then one of the same shape, answered from what the
    # first one learned, says the same
    first = job(1, 6, at=1)
    scheduler = FairShareScheduler(snapshot([team(1, 16)], [pool(1, 8)], [first]))
    assert admitted(scheduler.full_pass()) == [first.job_id]
    later, again = job(1, 4, at=2), job(1, 4, at=3)
    w = scheduler.submit(later).waiting[later.job_id]
    full, _ = decide([team(1, 16)], [pool(1, 8)], [first, later])
    assert w.reason == "capacity" and w.message == full.waiting[later.job_id].message
    assert f"{8 - first.total_gpus} GPUs free" in w.message
    assert w.detail["free_gpus_by_pool"] == {"1": 8 - first.total_gpus}
    w2 = scheduler.submit(again).waiting[again.job_id]
    assert (w2.message, w2.detail) == (w.message, w.detail)

# --- per-cluster quotas ------------------------------------------------------------------------

def test_a_per_cluster_quota_sends_the_overflow_to_the_next_cheapest_cluster():
    capped = team(1, 32)
    capped.cluster_caps[(H100, 1)] = 8  # at most 8 GPUs on cluster 1, the cheapest
    a, b, c, d_ = job(1, 8), job(1, 8), job(1, 8), job(1, 8)
    d, _ = decide([capped], [pool(1, 16, price="2.00"), pool(2, 16, price="4.00")], [a, b, c, d_])
    assert [(x.job.job_id, x.offer.cluster_id) for x in d.admissions] == [(a.job_id, 1), (b.job_id, 2), (c.job_id, 2)]
    assert d.waiting[d_.job_id].reason == "capacity"  # cluster 2 is full; cluster 1 has room but not for this team
    assert capped.cluster_used[(H100, 1)] == 8


def test_a_job_whose_matching_clusters_are_all_capped_waits_for_quota_and_says_where():
    capped = team(1, 32)
    capped.cluster_caps[(H100, 1)] = 12
    capped.cluster_used[(H100, 1)] = 8  # running work counts
    d, _ = decide([capped], [pool(1, 32)], [job(1, 8)])
    w = next(iter(d.waiting.values()))
    assert w.reason == "quota" and "c1" in w.message
    assert (w.detail["cluster_quota_gpus"], w.detail["cluster_used_gpus"]) == ({"c1": 12}, {"c1": 8})


def test_a_per_cluster_cap_of_another_team_or_cluster_changes_nothing():
    other = team(2, 8)
    other.cluster_caps[(H100, 1)] = 0
    free_team = team(1, 16)
    free_team.cluster_caps[(H100, 9)] = 0  # a cluster this job does not match
    d, _ = decide([free_team, other], [pool(1, 16)], [job(1, 8, nodes=2)])
    assert len(d.admissions) == 1 and d.admissions[0].offer.cluster_id == 1


# --- a pass's remembered reasons ------------------------------------------------------------

def test_waiting_jobs_are_told_the_room_left_after_the_pass_whenever_they_were_decided():
    # one node of 8 GPUs, 4 held by team 3: a (8 GPUs, first) waits; b (2 GPUs) is admitted; c, the same shape and
    # team as a, comes after b: both are told the room the pass left (not the 4 free when a was decided)
    runs = [running(90, 3, 4, 1, preemptible=False)]
    a, b, c = job(1, 8, priority=1000), job(2, 2, priority=500), job(1, 8, priority=100)
    d, _ = decide([team(1, 16), team(2, 16), team(3, 16)], [pool(1, 8)], [a, b, c], runs)
    assert admitted(d) == [b.job_id]
    left = 8 - 4 - b.total_gpus
    for w in (d.waiting[a.job_id], d.waiting[c.job_id]):
        assert w.detail["free_gpus_by_pool"] == {"1": left}
        assert f"{left} GPUs free" in w.message


def test_jobs_waiting_for_the_same_reason_each_get_their_own_positions():
    # nothing is booked between them: the three 8-GPU jobs of team 1 wait for the same room, each at its own place
    runs = [running(90, 3, 4, 1, preemptible=False)]
    jobs = [job(1, 8, priority=p) for p in (1000, 500, 100)]
    d, _ = decide([team(1, 16), team(3, 16)], [pool(1, 8)], jobs, runs)
    assert [d.waiting[j.job_id].team_position for j in jobs] == [1, 2, 3]
    assert [d.waiting[j.job_id].overall_position for j in jobs] == [1, 2, 3]
    assert len({d.waiting[j.job_id].message for j in jobs}) == 1
