"""The scheduling model as plain data: jobs, teams with quotas and budgets, the snapshot, and the decisions.

Kueue's vocabulary: a team is a ClusterQueue (nominal quota, borrowing and
lending limits per accelerator), teams sharing a ``cohort`` lend each other
their idle nominal quota, a node pool is a resource flavor. GPUs are
integers, money is Decimal USD, times are seconds on one monotonic epoch.

The CPU flavor's quota (Kueue's ``cpu`` resource of it) is held in the same
places as a GPU quota, counted in CPU millicores (``TeamQuota.cpu``): the
``*_gpus`` numbers of a ``TeamQuota`` and ``TeamState.used`` of the CPU
accelerator are millicores, and a CPU-only job (``gpus_per_node`` 0) counts
its ``QueuedJob.total_cpu_milli`` against it. A team without a CPU quota runs
CPU-only jobs quota-free: they count nothing (ADR 0012).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from core.cohorts import lendable
from core.gpus import exact_gpus

from .placement import PlacementRequest, PoolOffer


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The answer of one rule: ``ok``, otherwise ``reason`` (``quota``, ``budget``, ``capacity``) with the numbers in
    ``detail``.

    ``never`` is True when the request could not pass even with nothing else
    running or spent: the job should be rejected rather than wait.
    """

    ok: bool
    reason: str = ""
    message: str = ""
    detail: dict = dataclasses.field(default_factory=dict)
    never: bool = False


OK = Verdict(True)

#: How many of the jobs admitted ahead of a waiting job it is told of.
OVERTAKEN_SHOWN = 5


@dataclasses.dataclass(frozen=True)
class QuotaView:
    """A team's quota for one accelerator: nominal and borrowing limit, GPUs; per-job cap (0 = none)."""

    nominal_gpus: int
    borrowing_limit_gpus: int = 0
    max_gpus_per_job: int = 0
    #: The most the team can actually hold (``core.cohorts.reachable``); None: nominal + borrowing limit.
    reachable_gpus: int | None = None

    @property
    def limit_gpus(self) -> int:
        """Nominal + borrowing limit, capped by what the cohort can lend when that is known."""
        limit = self.nominal_gpus + self.borrowing_limit_gpus
        return limit if self.reachable_gpus is None else min(limit, self.reachable_gpus)


@dataclasses.dataclass(frozen=True)
class BudgetView:
    """A budget's state in its current period, USD: amount, spent (ledger), committed (running jobs' remaining estimate)."""

    budget_id: int
    amount_usd: Decimal
    spent_usd: Decimal
    committed_usd: Decimal
    action: str

    @property
    def remaining_usd(self) -> Decimal:
        return self.amount_usd - self.spent_usd - self.committed_usd


@dataclasses.dataclass(frozen=True, slots=True)
class RoleShape:
    """One role of a multi-role job (a gang of several pod shapes): ``nodes`` pods, each on a node of its own, with
    ``gpus_per_node`` GPUs, ``cpu_milli`` CPU (millicores) and ``memory_mib`` memory (MiB)."""

    name: str
    nodes: int
    gpus_per_node: int
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclasses.dataclass(slots=True)
class QueuedJob:
    """A waiting job: ``nodes`` x ``gpus_per_node`` GPUs of one accelerator (or of one of ``alternatives``, accelerator
    ids in order of preference after ``accelerator_id``), with ``cpu_milli`` CPU (millicores) and ``memory_mib``
    memory (MiB) per node; its priority (higher first), submission time (seconds, any monotonic epoch), max
    runtime (s) and placement constraints."""

    job_id: int
    team_id: int
    accelerator_id: int
    nodes: int
    gpus_per_node: int
    priority: int = 500
    submitted: float = 0.0
    preemptible: bool = False
    max_runtime_seconds: int = 3600
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    recovering: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0
    alternatives: tuple[int, ...] = ()
    #: Its pods may share a node (an inference job's replicas: ``placement.PlacementRequest.share_nodes``).
    share_nodes: bool = False
    #: Cluster ids whose spot capacity reclaimed one of its attempts within ``SPOT_RECLAIM_AVOID_SECONDS``: its
    #: placement tries every other cluster's pools first (``room.Room.place``; ADR 0018).
    avoid_clusters: tuple[int, ...] = ()
    #: A multi-role job's roles (empty: one shape, the fields above): admitted all together or not at all, every
    #: role node-exact on one pool (``nodebook.NodeBook.place_gang``); ``nodes`` is then all their pods and
    #: ``total_gpus`` / ``total_cpu_milli`` their sums. Such a job is neither preempted nor preempts (ADR 0039).
    roles: tuple[RoleShape, ...] = ()
    #: Part of one GPU (ADR 0040): its pod's share in milli-GPUs (a MIG profile's share too), or a MIG profile
    #: (``gpus_per_node`` is then 1, the one device it asks; quotas count the share: ``quota_gpus``). Such a job
    #: neither preempts nor is preempted.
    share_milli: int = 0
    mig_profile: str = ""
    key: tuple = dataclasses.field(init=False, repr=False, compare=False)
    #: What placement depends on, whatever the accelerator: size per node, spot rule and constraints (a cache key).
    shape: tuple = dataclasses.field(init=False, repr=False, compare=False)
    #: nodes x gpus_per_node: every pod holds gpus_per_node (a serving job's replicas are counted in ``nodes``, and
    #: may share a node: ``share_nodes``, ``jobs.scheduling.snapshot.pods_of``). Set once, as the pass reads it.
    total_gpus: int = dataclasses.field(init=False, repr=False, compare=False)
    #: Whether the job asks no GPUs (it runs on the CPU flavor).
    cpu_only: bool = dataclasses.field(init=False, repr=False, compare=False)
    #: The GPUs it counts against quotas, cohorts, per-cluster caps and its estimate: ``total_gpus`` (an int), or
    #: for a job on part of one GPU its share, exactly (``core.gpus.exact_gpus``: ``Decimal("0.25")``; ADR 0040).
    quota_gpus: int | Decimal = dataclasses.field(init=False, repr=False, compare=False)
    _request: PlacementRequest | None = dataclasses.field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self):
        self.key = (-self.priority, self.submitted, self.job_id)
        self.shape = (self.nodes, self.gpus_per_node, self.cpu_milli, self.memory_mib, self.preemptible,
                      self.providers, self.regions, self.clusters, self.share_nodes, self.avoid_clusters, self.roles,
                      self.share_milli, self.mig_profile)
        if self.roles:
            self.total_gpus = sum(r.nodes * r.gpus_per_node for r in self.roles)
            self.cpu_only = all(r.gpus_per_node == 0 for r in self.roles)
        else:
            self.total_gpus = self.nodes * self.gpus_per_node
            self.cpu_only = self.gpus_per_node == 0
        self.quota_gpus = exact_gpus(self.share_milli) if self.share_milli else self.total_gpus

    @property
    def total_cpu_milli(self) -> int:
        """CPU millicores of all its pods: nodes (replicas included) x cpu_milli, as the pods request them (a
        multi-role job: summed over its roles)."""
        if self.roles:
            return sum(r.nodes * r.cpu_milli for r in self.roles)
        return self.nodes * self.cpu_milli

    @property
    def total_memory_mib(self) -> int:
        """Memory (MiB) of all its pods, as ``total_cpu_milli`` counts CPU."""
        if self.roles:
            return sum(r.nodes * r.memory_mib for r in self.roles)
        return self.nodes * self.memory_mib

    def role_job(self, name: str) -> QueuedJob:
        """The pods of role ``name`` as a job of one shape (for the verdicts and reasons that name what is
        short). KeyError for an unknown role."""
        role = next((r for r in self.roles if r.name == name), None)
        if role is None:
            raise KeyError(name)
        return QueuedJob(self.job_id, self.team_id, self.accelerator_id, role.nodes, role.gpus_per_node,
                         self.priority, self.submitted, self.preemptible, self.max_runtime_seconds, self.providers,
                         self.regions, self.clusters, self.recovering, role.cpu_milli, role.memory_mib)

    def role_requests(self) -> tuple[tuple[str, PlacementRequest], ...]:
        """``(role name, what placement reads of it)`` for each role of a multi-role job (its placement rules and
        spot rule are the job's); empty for a job of one shape."""
        return tuple((r.name, PlacementRequest(r.nodes, r.gpus_per_node, self.preemptible, self.providers,
                                               self.regions, self.clusters, r.cpu_milli, r.memory_mib, False))
                     for r in self.roles)

    def order_key(self) -> tuple:
        """A team's queue order: priority high first, then submission time, then id."""
        return self.key

    def placement(self) -> PlacementRequest:
        """What placement reads of the job (made once: a pass asks for it at every step that places)."""
        request = self._request
        if request is None:
            request = self._request = PlacementRequest(self.nodes, self.gpus_per_node, self.preemptible,
                                                       self.providers, self.regions, self.clusters, self.cpu_milli,
                                                       self.memory_mib, self.share_nodes, self.share_milli,
                                                       self.mig_profile)
        return request

    @property
    def accelerator_ids(self) -> tuple[int, ...]:
        """The accelerators the job accepts, in order of preference."""
        return (self.accelerator_id, *self.alternatives) if self.alternatives else (self.accelerator_id,)


@dataclasses.dataclass(slots=True)
class RunningJob:
    """A live attempt that holds ``gpus`` GPUs on ``node_pool_id``; ``admitted`` in seconds (same epoch as submissions);
    ``node_names``: the nodes it holds, each with ``gpus_per_node`` GPUs, ``cpu_milli`` and ``memory_mib``
    (empty: not recorded; its GPUs are given back to the pool's fullest nodes)."""

    job_id: int
    attempt_id: int
    team_id: int
    accelerator_id: int
    node_pool_id: int
    gpus: int
    priority: int = 500
    admitted: float = 0.0
    preemptible: bool = False
    node_names: tuple[str, ...] = ()
    gpus_per_node: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    #: Part of one GPU (ADR 0040): the share (milli-GPUs) or MIG profile it holds on its node; never a victim.
    share_milli: int = 0
    mig_profile: str = ""
    #: Its max run time (s) from ``admitted``: backfill plans its nodes free then (``backfill``); 0: unknown, its
    #: nodes free at no planned time.
    max_runtime_seconds: int = 0

    @property
    def quota_gpus(self) -> int | Decimal:
        """The GPUs it counts against its team's quota: ``gpus``, or its share exactly (``core.gpus.exact_gpus``)."""
        return exact_gpus(self.share_milli) if self.share_milli else self.gpus


@dataclasses.dataclass(slots=True)
class TeamQuota:
    """One team's quota for one accelerator, GPUs: nominal, borrowing limit, lending limit (None = all of
    nominal is lendable), per-job cap (0 = none). With ``cpu`` (the CPU flavor's quota) every number is CPU
    millicores instead (the stored vCPUs x 1000) and it counts CPU-only jobs' millicores."""

    nominal_gpus: int
    borrowing_limit_gpus: int = 0
    lending_limit_gpus: int | None = None
    max_gpus_per_job: int = 0
    #: What the team can actually reach (``core.cohorts.reachable``), set by the scheduler from its cohort.
    reachable_gpus: int | None = None
    #: A CPU quota: the numbers above are CPU millicores.
    cpu: bool = False

    @property
    def lendable_gpus(self) -> int:
        """The part of nominal the cohort may borrow (``core.cohorts.lendable``)."""
        return lendable(self.nominal_gpus, self.lending_limit_gpus)

    @property
    def guaranteed_gpus(self) -> int:
        """The part of nominal the team never lends."""
        return self.nominal_gpus - self.lendable_gpus

    def view(self) -> QuotaView:
        """The numbers ``rules.check_quota`` reads."""
        return QuotaView(self.nominal_gpus, self.borrowing_limit_gpus, self.max_gpus_per_job, self.reachable_gpus)


#: The quota of a team on an accelerator it has none for, as a job asking no GPUs (CPU-only) sees it: nothing
#: guaranteed, nothing to borrow, and nothing asked of it.
NO_QUOTA = TeamQuota(0)


@dataclasses.dataclass(slots=True)
class TeamState:
    """A team: cohort key (None = the default cohort), weight (> 0), quotas and live usage by accelerator id (GPUs:
    an int, or an exact Decimal once a job on part of one GPU counts its share, ``QueuedJob.quota_gpus``;
    CPU millicores of its CPU-only attempts for the CPU flavor, present only when it has a CPU quota),
    its budgets in force (USD), its queueing strategy (Kueue's names: ``BestEffortFIFO``, the default, lets a
    job that can be admitted pass a head that cannot; ``StrictFIFO`` keeps the order) and its decayed usage
    (``fair_usage``, ``usage``)."""

    team_id: int
    cohort: object = None
    weight: float = 1.0
    quotas: dict[int, TeamQuota] = dataclasses.field(default_factory=dict)
    used: dict[int, int | Decimal] = dataclasses.field(default_factory=dict)
    budgets: list[BudgetView] = dataclasses.field(default_factory=list)
    #: Per-cluster caps, GPUs, by (accelerator id, cluster id): the team's nominal + borrowing limit there
    #: (a ``Quota`` row with a cluster). Only clusters listed are capped; the team-wide quota still applies.
    cluster_caps: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)
    #: Live GPUs by (accelerator id, cluster id), for the capped clusters.
    cluster_used: dict[tuple[int, int], int | Decimal] = dataclasses.field(default_factory=dict)
    strategy: str = "BestEffortFIFO"
    #: In a tree of cohorts (ADR 0046): the cohort the team belongs to, a key of ``Snapshot.cohort_levels``
    #: (``cohort`` is then the tree's root); None: a plain (flat) cohort.
    parent_cohort: object = None
    #: Decayed usage as of the snapshot, GPU-seconds (``usage.advance``; 0 while fair sharing over time is off):
    #: between teams, lower ``fair_usage / weight`` goes first and is preempted last (docs/adr/0045).
    fair_usage: Decimal = Decimal(0)


@dataclasses.dataclass
class Snapshot:
    """Everything one pass needs: teams by id, node pools by accelerator id (their nodes' free resources now,
    price), the waiting jobs, the live attempts (for preemption) and the packing policy
    (``nodebook.PACKING_POLICIES``; None: the default), with the expected workload the ``fgd`` policy packs for
    (``placement.WorkloadShape``s; empty: the shapes of the waiting and live jobs)."""

    teams: dict[int, TeamState]
    pools: dict[int, list[PoolOffer]]
    queue: list[QueuedJob]
    running: list[RunningJob] = dataclasses.field(default_factory=list)
    #: Node pools left out of ``pools`` because the catalog has no price for them (price None), for wait reasons.
    unpriced: dict[int, list[PoolOffer]] = dataclasses.field(default_factory=dict)
    policy: str | None = None
    workload: tuple[tuple[int, int, int, float], ...] = ()
    #: Backfill with reservations (``backfill``, ADR 0044): the pass's time (seconds, the submissions' epoch; None:
    #: no reservations), every live attempt with its max run time (empty: ``running``), the wait (s since
    #: submission) after which any job waiting for capacity gets a reservation (None: StrictFIFO heads only), and
    #: the most reservations held.
    now: float | None = None
    live: list[RunningJob] = dataclasses.field(default_factory=list)
    reserve_after_s: float | None = None
    max_reservations: int = 16
    #: The cohorts of trees of cohorts (``core.cohorts.Level``s keyed ``("cohort", id)``, GPUs per accelerator id;
    #: ADR 0046), for the teams whose ``parent_cohort`` is set; empty: every cohort is plain (flat).
    cohort_levels: tuple = ()
    #: Fair sharing over time's entry penalty, GPU-seconds per GPU admitted (``usage.entry_penalty``; 0: none): an
    #: admission adds it, times the job's GPUs, to its team's decayed usage for the rest of the pass.
    entry_penalty: Decimal = Decimal(0)


@dataclasses.dataclass(slots=True)
class Admission:
    """Admit ``job`` on ``offer`` at ``estimate_usd``, after preempting ``victims`` (usually none), on the nodes
    ``node_names`` of the pool (one per node of the job), charged to ``accelerator_id`` (the job's accelerator, or
    the alternative it got)."""

    job: QueuedJob
    offer: PoolOffer
    estimate_usd: Decimal
    victims: tuple[RunningJob, ...] = ()
    node_names: tuple[str, ...] = ()
    accelerator_id: int = 0
    #: A multi-role job's nodes by role, ``(role name, node names)`` in the job's role order (``node_names``: all of
    #: them, in that order).
    role_nodes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: A job on a share of a GPU: the index of the physical GPU of its node the share is booked on (the platform's
    #: model of where it sits, ADR 0040); None otherwise.
    gpu_index: int | None = None


@dataclasses.dataclass(slots=True)
class Rejection:
    """``job`` can never run (no quota, over a cap or limit, over a whole block budget)."""

    job: QueuedJob
    verdict: Verdict


@dataclasses.dataclass(slots=True)
class Waiting:
    """``job`` stays queued: ``reason`` (quota, budget, capacity, priority), a message, the numbers, and its
    1-based position in its team's queue and among all waiting jobs."""

    job: QueuedJob
    reason: str
    message: str
    detail: dict
    team_position: int = 0
    overall_position: int = 0
    #: Later jobs (in the queue's overall order) of the same accelerator that the pass admitted while this job
    #: waited, as the decision loop saw them (``cycle.FairShareScheduler``; at most ``OVERTAKEN_SHOWN``); None: none.
    overtaken_by: list[QueuedJob] | None = None
    #: The nodes held for it and its expected start (``backfill.Reservation``); None: none.
    reservation: object = None

    @classmethod
    def because(cls, job: QueuedJob, verdict: Verdict) -> Waiting:
        """``job`` waits for the rule that said ``verdict`` (not ok)."""
        return cls(job, verdict.reason, verdict.message, verdict.detail)

    def verdict(self) -> Verdict:
        """Why the job waits, as the rule's answer (never ok)."""
        return Verdict(False, self.reason, self.message, self.detail)

    def info(self) -> dict:
        """The job's ``queue_info``: reason, message, numbers and ``position`` {team, overall}."""
        info = {"reason": self.reason, "message": self.message, **self.detail,
                "position": {"team": self.team_position, "overall": self.overall_position}}
        if self.reservation is not None:
            info["reservation"] = self.reservation.info()
        return info


Decision = Admission | Rejection | Waiting


@dataclasses.dataclass
class Decisions:
    """The outcome of a pass, in decision order."""

    admissions: list[Admission] = dataclasses.field(default_factory=list)
    rejections: list[Rejection] = dataclasses.field(default_factory=list)
    waiting: dict[int, Waiting] = dataclasses.field(default_factory=dict)
    #: Job id -> the ``backfill.Reservation`` the pass holds for it.
    reservations: dict = dataclasses.field(default_factory=dict)

    @property
    def preemptions(self) -> list[tuple[RunningJob, int]]:
        """``(victim, preemptor job id)`` pairs."""
        return [(v, a.job.job_id) for a in self.admissions for v in a.victims]


@dataclasses.dataclass(frozen=True)
class Assessment:
    """What the rules say of one job before it is submitted: the pool it would run on (``fits_now``: it has room
    now; otherwise the cheapest that could ever hold it; None when none can), the estimated cost at that pool's
    price (USD, None without a pool), and the quota and budget verdicts (``budget`` None without an estimate).

    When no pool can hold it as the fleet is now (cordoned or unhealthy nodes, an unhealthy cluster), ``unplaced``
    is the verdict that says why, and the estimate is at the price of ``estimate_offer``: the cheapest priced pool
    its rules allow that could hold it once those nodes take work again (None: none could; then the estimate is
    None, and ``unplaced`` says whether a pool without a price would).

    When a pool could hold it but none has room now, ``capacity`` is the verdict a waiting job's page shows
    (``rules.no_room``: its message names the short resource with numbers, its detail's ``short_of`` which one:
    ``gpu``, ``cpu``, ``memory`` or ``nodes``); None otherwise."""

    offer: PoolOffer | None
    fits_now: bool
    estimate_usd: Decimal | None
    quota: Verdict
    budget: Verdict | None
    unplaced: Verdict | None = None
    estimate_offer: PoolOffer | None = None
    capacity: Verdict | None = None
