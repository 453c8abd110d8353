"""The pure scheduling core: no Django, no database, so a pass over 100,000 jobs is plain Python over plain data.

Split as Kueue decomposes scheduling:

- ``types``: the model (queued and running jobs, teams with quotas, budgets
  and usage, the snapshot) and the decisions (admission, rejection, waiting);
- ``placement``: node pools as resource flavors and which could ever hold a
  job; ``nodebook``: the nodes' free resources, the packing policies and
  which pool has room now;
- ``rules``: every admission rule, written once (quota, per-cluster caps,
  cohort borrowing, capacity, budgets, the cost estimate);
- ``order``: priority, then fair share (weighted decayed usage, then
  dominant share), then submission; ``usage``: the decayed usage's
  arithmetic (fair sharing over time, docs/adr/0045);
- ``preemption``: victim selection within a cohort;
- ``cohort``: cohort accounting (usage, lendable pools, shares) and the
  generation counters every usage change bumps;
- ``room``: which pools could hold a job and where it fits now;
- ``evaluate``: one job's evaluation, step by step;
- ``memo``: what a scheduler remembers, stamped with generations, and
  ``NullMemo``, which remembers nothing;
- ``positions``: the waiting jobs' queue positions;
- ``cycle``: the scheduling cycle as numbered steps (``decide``,
  ``FairShareScheduler`` for incremental passes, ``recheck`` of one
  admission, ``assess`` of a job not yet submitted).

Everything a caller needs is importable from here.
"""

from .cycle import QUEUEING_STRATEGIES, FairShareScheduler, assess, decide, recheck
from .memo import DecisionMemo, NullMemo
from .nodebook import (
    DEFAULT_PACKING_POLICY,
    PACKING_POLICIES,
    NodeBook,
    choose_pool,
    fits_now,
    fragment_gpus,
    workload_of,
)
from .placement import (
    UNLIMITED,
    NodeRoom,
    PlacementRequest,
    PoolOffer,
    allowed,
    capable_nodes,
    holds_share,
    matches,
    pods_held,
    pods_on,
    price_order,
)
from .rules import (
    ESTIMATE_QUANTUM,
    budget_refusal,
    check_budgets,
    check_cpu_quota,
    check_quota,
    cohort_has_room,
    estimate_cost,
    job_estimate,
    needs_phrase,
    overtaken_note,
    price_text,
    short_resource,
)
from .types import (
    OK,
    Admission,
    Assessment,
    BudgetView,
    Decision,
    Decisions,
    QueuedJob,
    QuotaView,
    Rejection,
    RoleShape,
    RunningJob,
    Snapshot,
    TeamQuota,
    TeamState,
    Verdict,
    Waiting,
)

__all__ = [
    "DEFAULT_PACKING_POLICY", "NodeBook", "NodeRoom", "PACKING_POLICIES", "QUEUEING_STRATEGIES", "UNLIMITED",
    "ESTIMATE_QUANTUM", "OK", "Admission", "Assessment", "BudgetView", "DecisionMemo", "Decision", "Decisions",
    "FairShareScheduler", "NullMemo",
    "PlacementRequest", "PoolOffer", "QueuedJob", "QuotaView", "RoleShape", "Rejection", "RunningJob", "Snapshot", "TeamQuota",
    "TeamState", "Verdict", "Waiting", "allowed", "assess", "budget_refusal", "capable_nodes", "check_budgets", "check_cpu_quota", "check_quota", "choose_pool", "cohort_has_room",
    "decide", "estimate_cost", "fits_now", "fragment_gpus", "holds_share", "job_estimate", "matches", "pods_held",
    "pods_on",
    "needs_phrase", "overtaken_note", "price_order", "price_text", "recheck", "short_resource",
    "workload_of",
]
