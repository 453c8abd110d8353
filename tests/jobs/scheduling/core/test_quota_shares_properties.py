"""Property-based tests of quota counting with shares of a GPU (ADR 0040; hypothesis): for random mixes of shares
(0.01 to 0.99 GPU, MIG eighths) and whole GPUs under a quota of whole GPUs, on a fleet with room for all of them (so
the quota alone decides), a pass never admits more than the quota, every job it leaves waiting waits for quota
and would overflow it, and a request equal to what is left is admitted (shares add exactly: no float drift).
Sums are Fractions computed here from the jobs' own numbers."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.scheduling.core import FairShareScheduler, NodeRoom, PoolOffer, QueuedJob, Snapshot
from tests.support import scheduling as pure

H100 = pure.H100
#: A time-sliced node of 24 GPUs x 10 slices (more GPUs than a pass admits shares: one is always empty) and a plain
#: node of 16 whole GPUs (more than any quota here): room is never what a job waits for.
SHARED = NodeRoom("ts", 0, 0, shares=(1000,) * 24, slices=(10,) * 24)
PLAIN = NodeRoom("plain", 16, 16)
POOL = PoolOffer(node_pool_id=1, cluster_id=1, cluster_name="c1", provider="aws", region="us-east-1",
                 capacity_type="on-demand", nodes=2, gpus_per_node=16, free_gpus=16, usd_per_gpu_hour=Decimal("4.20"),
                 node_rooms=(SHARED, PLAIN))

asks = st.one_of(st.integers(1, 99).map(lambda n: ("share", n * 10)),
                 st.sampled_from([("share", 125), ("share", 250), ("share", 375), ("share", 875)]),
                 st.integers(1, 2).map(lambda g: ("whole", g)))


def queued(job_id: int, ask: tuple[str, int]) -> QueuedJob:
    kind, n = ask
    if kind == "share":
        return QueuedJob(job_id, 1, H100, 1, 1, submitted=float(job_id), share_milli=n)
    return QueuedJob(job_id, 1, H100, 1, n, submitted=float(job_id))


def gpus(ask: tuple[str, int]) -> Fraction:
    """What the test counts a job as: its share of one GPU, or its whole GPUs."""
    kind, n = ask
    return Fraction(n, 1000) if kind == "share" else Fraction(n)


def decide(nominal: int, used: Fraction, jobs: list[QueuedJob]):
    """One pass of a team with ``nominal`` GPUs (no borrowing) already using ``used`` (given as the snapshot gives
    it: an int when whole, else an exact Decimal)."""
    held = int(used) if used.denominator == 1 else Decimal(used.numerator) / Decimal(used.denominator)
    team = pure.team(1, nominal, used=held)
    return FairShareScheduler(Snapshot({1: team}, {H100: [POOL]}, jobs)).full_pass()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.lists(asks, min_size=1, max_size=20))
def test_admitted_shares_never_exceed_the_quota_and_what_is_left_is_admitted(nominal, mix):
    jobs = {i + 1: ask for i, ask in enumerate(mix)}
    decisions = decide(nominal, Fraction(0), [queued(i, a) for i, a in jobs.items()])

    admitted = [a.job.job_id for a in decisions.admissions]
    total = sum((gpus(jobs[i]) for i in admitted), Fraction(0))
    assert total <= nominal
    for w in decisions.waiting.values():  # room is ample: only the quota keeps a job out, and it would overflow it
        assert w.reason == "quota", (w.reason, w.message)
        assert total + gpus(jobs[w.job.job_id]) > nominal

    left = nominal - total
    exact = []  # what is left, asked exactly: its fraction as a share, its whole GPUs as a whole-GPU job
    if left - int(left):
        exact.append(queued(100, ("share", int((left - int(left)) * 1000))))
    if int(left):
        exact.append(queued(101, ("whole", int(left))))
    if exact:
        filled = decide(nominal, total, exact)
        assert sorted(a.job.job_id for a in filled.admissions) == [j.job_id for j in exact]
    full = decide(nominal, Fraction(nominal), [queued(102, ("share", 10))])  # the finest share over a full quota
    assert not full.admissions and full.waiting[102].reason == "quota"
