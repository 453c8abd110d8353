"""Preemption rules of the pure core: only a team within its nominal quota preempts, only preemptible work above
its team's nominal quota is taken, lowest priority then most recent first, the fewest victims, and no loop.

One accelerator; teams are numbered; GPU counts are whole GPUs.
"""

from tests.support.scheduling import H100, admitted, decide, job, pool, running, team


def test_a_team_within_nominal_preempts_borrowers_lowest_priority_then_most_recent():
    # team 1 (nominal 8) holds 16: a1 4 normal t1, a2 4 low t2, a3 4 normal t3 (preemptible), a4 4 not preemptible
    runs = [running(1, 1, 4, 1, admitted=1), running(2, 1, 4, 1, priority=100, admitted=2),
            running(3, 1, 4, 1, admitted=3), running(4, 1, 4, 1, admitted=4, preemptible=False)]
    want = job(2, 4, nodes=2)  # team 2 asks its nominal 8: 8 to free in the pool and in the cohort (16 + 8 - 16)
    d, _ = decide([team(1, 8, 8), team(2, 8)], [pool(1, 16, gpus_per_node=4)], [want], runs)
    assert admitted(d) == [want.job_id]
    assert [v.job_id for v in d.admissions[0].victims] == [2, 3]  # a2 (low), then a3 (admitted last)


def test_the_fewest_victims_are_taken():
    # team 1 (nominal 4) holds 16: x 4 low t5, y 8 normal t1 (preemptible), z 4 not preemptible
    runs = [running(11, 1, 4, 1, priority=100, admitted=5), running(12, 1, 8, 1, admitted=1),
            running(13, 1, 4, 1, admitted=2, preemptible=False)]
    want = job(2, 8)
    d, _ = decide([team(1, 4, 12), team(2, 12)], [pool(1, 16)], [want], runs)
    # greedy takes x then y; x alone frees too little and y alone is enough, so only y goes
    assert [v.job_id for v in d.admissions[0].victims] == [12]


def test_work_within_the_victims_nominal_quota_is_never_preempted():
    # team 1 (nominal 8) holds 12 in three preemptible 4-GPU jobs: only 4 GPUs of it are above its nominal.
    # Team 3 holds 4 within its nominal. The pool (16) is full; team 2 asks its nominal 8.
    runs = [running(21, 1, 4, 1, admitted=1), running(22, 1, 4, 1, admitted=2), running(23, 1, 4, 1, admitted=3),
            running(24, 3, 4, 1, preemptible=False)]
    want = job(2, 8)
    d, _ = decide([team(1, 8, 8), team(2, 8), team(3, 8)], [pool(1, 16)], [want], runs)
    # freeing 8 would take team 1 down to 4 < 8: nothing is preempted, the job waits for capacity
    assert admitted(d) == [] and d.preemptions == []
    assert d.waiting[want.job_id].reason == "capacity"


def test_non_preemptible_jobs_are_never_preempted():
    runs = [running(31, 1, 16, 1, preemptible=False)]
    want = job(2, 8)
    d, _ = decide([team(1, 8, 8), team(2, 8)], [pool(1, 16)], [want], runs)
    assert admitted(d) == [] and d.waiting[want.job_id].reason == "quota"


def test_a_borrowing_job_never_preempts():
    runs = [running(41, 1, 16, 1)]
    want = job(2, 8, nodes=1)
    # team 2's nominal is 4: 8 would borrow, so it waits instead of preempting team 1's borrowed work
    d, _ = decide([team(1, 8, 8), team(2, 4, 8), team(3, 4)], [pool(1, 16)], [want], runs)
    assert admitted(d) == [] and d.preemptions == []


def test_preemption_does_not_loop_the_victim_waits_and_preempts_nobody():
    runs = [running(51, 1, 8, 1, admitted=1), running(52, 1, 8, 1, admitted=2)]
    want = job(2, 8, at=10)
    d, _ = decide([team(1, 8, 8), team(2, 8)], [pool(1, 16)], [want], runs)
    assert [v.job_id for v in d.admissions[0].victims] == [52]
    # next pass: the victim is queued again (its submission time is older), the preemptor runs within nominal
    victim = job(1, 8, at=0, job_id=52, preemptible=True)
    runs2 = [running(51, 1, 8, 1, admitted=1), running(want.job_id, 2, 8, 1, admitted=11, preemptible=False)]
    d2, _ = decide([team(1, 8, 8), team(2, 8)], [pool(1, 16)], [victim], runs2)
    assert admitted(d2) == [] and d2.preemptions == []
    assert d2.waiting[52].reason in ("quota", "capacity")


def test_preempting_a_capped_teams_job_gives_its_cluster_room_back():
    borrower = team(1, 0, 16)
    borrower.cluster_caps[(H100, 1)] = 16
    borrower.cluster_used[(H100, 1)] = 8
    owner = team(2, 8)
    runs = [running(1, 1, 8, 1)]
    want = job(2, 8)
    d, scheduler = decide([borrower, owner], [pool(1, 8)], [want], runs)
    assert admitted(d) == [want.job_id] and [v.job_id for v in d.admissions[0].victims] == [1]
    assert scheduler.teams[1].cluster_used[(H100, 1)] == 0
