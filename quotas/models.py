"""Tenancy and entitlement: teams, their members and API tokens, GPU and CPU quotas and money budgets."""

import datetime as dt
import hashlib
import secrets
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from core import cohorts
from core.lookups import LookupCache


def scope_to_teams(queryset, user, team_field: str = "team"):
    """The rows of ``queryset`` whose team (reached by ``team_field``) has ``user`` as a member; all rows for staff.

    One definition of tenancy for every team-owned model, so a view cannot
    scope one way and a report another. A user in no team sees nothing.
    """
    if user.is_staff:
        return queryset
    return queryset.filter(**{f"{team_field}__memberships__user": user})


class TeamQuerySet(models.QuerySet):
    def visible_to(self, user) -> "TeamQuerySet":
        """Teams ``user`` belongs to; all teams for staff."""
        if user.is_staff:
            return self
        return self.filter(memberships__user=user).distinct()


class Cohort(models.Model):
    """A set of teams that lend each other their unused nominal quota (Kueue's Cohort), and a level of an
    organisation's tree of cohorts (Kueue's hierarchical cohorts: a Cohort's ``parentName``).

    Teams without a cohort form the default cohort together. ``parent`` (null: a root) nests it: an organisation
    is a root, its departments its children, teams the leaves (``Team.cohort``); a parent chain never loops
    (``parent_cycle``, checked by ``clean`` and the API). ``weight`` (> 0, default 1) is its fair-sharing weight
    among its siblings (Kueue's ``fairSharing.weight``). Its own quotas are ``CohortQuota`` rows. ADR 0046.
    """

    name = models.SlugField(max_length=63, unique=True)
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="children")
    weight = models.DecimalField(max_digits=8, decimal_places=3, default=Decimal("1"),
                                 validators=[MinValueValidator(Decimal("0.001"))])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        """``ValidationError`` on ``parent`` when the parent chain would come back to this cohort."""
        loop = parent_cycle(self.pk, self.parent_id)
        if loop:
            raise ValidationError({"parent": [loop]})


#: The most levels a tree of cohorts may have (an organisation, its departments, their groups, ...); a deeper
#: chain is refused like a loop, so a parent walk always ends.
MAX_COHORT_DEPTH = 8


def parent_cycle(cohort_id: int | None, parent_id: int | None) -> str:
    """Why cohort ``cohort_id`` (None: a new one) may not have parent ``parent_id``, or "" when it may: the parent
    chain from ``parent_id`` reaches ``cohort_id`` (a loop), or the tree would have more than ``MAX_COHORT_DEPTH``
    levels: the levels above the cohort (``parent_id`` and its ancestors) plus the cohort and the deepest chain of
    its own descendants, which move with it. One query (all parent links)."""
    if parent_id is None:
        return ""
    if cohort_id is not None and parent_id == cohort_id:
        return "a cohort cannot be its own parent"
    parents = dict(Cohort.objects.values_list("pk", "parent_id"))
    chain, at = [parent_id], parents.get(parent_id)
    while at is not None:
        if at == cohort_id or at in chain:
            names = dict(Cohort.objects.filter(pk__in=[*chain, at]).values_list("pk", "name"))
            path = " > ".join(names.get(c, str(c)) for c in [*chain, at])
            return f"the parent chain would loop back to this cohort: {path} (each cohort's parent after it)"
        chain.append(at)
        if len(chain) >= MAX_COHORT_DEPTH:
            return f"a tree of cohorts has at most {MAX_COHORT_DEPTH} levels"
        at = parents.get(at)
    if len(chain) + _subtree_height(cohort_id, parents) > MAX_COHORT_DEPTH:
        return (f"a tree of cohorts has at most {MAX_COHORT_DEPTH} levels: {len(chain)} above this cohort and "
                f"{_subtree_height(cohort_id, parents)} from it down to its deepest descendant")
    return ""


def lock_cohort_tree() -> None:
    """Lock every cohort row (``SELECT ... FOR UPDATE``, in id order, so two writers never deadlock) until the
    caller's transaction ends. A change of a cohort's parent (or a new or deleted cohort) takes it before it reads
    the parent links, so two concurrent changes cannot each pass ``parent_cycle`` on the links the other is about
    to change and together close a loop or pass the depth limit. Must run inside ``transaction.atomic``."""
    list(Cohort.objects.select_for_update().order_by("pk").values_list("pk", flat=True))


def _subtree_height(cohort_id: int | None, parents: dict[int, int | None]) -> int:
    """The levels from cohort ``cohort_id`` down to its deepest descendant, itself included (1: no children; a new
    cohort has none). ``parents``: every cohort's parent id by id. A loop already stored is walked once."""
    if cohort_id is None:
        return 1
    children: dict[int, list[int]] = {}
    for pk, parent in parents.items():
        if parent is not None:
            children.setdefault(parent, []).append(pk)
    height, level, seen = 0, [cohort_id], set()
    while level:
        height += 1
        seen.update(level)
        level = [kid for pk in level for kid in children.get(pk, []) if kid not in seen]
    return height


class CohortQuota(models.Model):
    """A cohort's own GPUs of one accelerator, shared by its subtree (Kueue's Cohort ``resourceGroups``).

    ``nominal_gpus`` adds to what the cohort's subtree holds; ``borrowing_limit_gpus`` is the most its subtree
    may use above all the nominal quota inside it, borrowed from its parent (null: no limit, Kueue's default for
    a Cohort); ``lending_limit_gpus`` is the most of its subtree's unused quota that teams outside it may use
    (null: all of it). A root cohort borrows from nobody: its borrowing limit is moot. ADR 0046.
    """

    cohort = models.ForeignKey(Cohort, on_delete=models.CASCADE, related_name="quotas")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="cohort_quotas")
    nominal_gpus = models.PositiveIntegerField(default=0)
    borrowing_limit_gpus = models.PositiveIntegerField(null=True, blank=True)
    lending_limit_gpus = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["cohort__name", "accelerator__name"]
        constraints = [models.UniqueConstraint(fields=["cohort", "accelerator"], name="cohort_quota_unique")]

    def __str__(self) -> str:
        return f"{self.cohort} {self.accelerator}: {self.nominal_gpus}"


# --- trees of cohorts as the scheduler and the API read them (ADR 0046) ---------------------------------------------
# A cohort is in a tree when its root's tree has more than one cohort or a cohort quota (``CohortQuota``); a lone
# cohort without quotas is a plain (flat) cohort and stays out, so its teams are decided exactly as before trees
# existed. Levels (``core.cohorts.Level``) are keyed ``("cohort", id)``; amounts are whole GPUs by accelerator id.

def cohort_key(cohort_id: int) -> tuple[str, int]:
    """The key of cohort ``cohort_id`` in a tree (``core.cohorts.CohortTree``)."""
    return ("cohort", cohort_id)


def cohort_levels(*, every: bool = False) -> tuple[dict[tuple, cohorts.Level], dict[int, tuple]]:
    """``(levels, root_of)``: the ``Level`` of every cohort in a tree, by key (its nominal quota, borrowing and
    lending limits by accelerator id, its weight and name), and the root key of each such cohort by id. ``every``:
    every cohort, lone plain ones too (for showing the forest). Two queries."""
    rows = list(Cohort.objects.values_list("pk", "name", "parent_id", "weight"))
    nominal: dict[int, dict] = {}
    borrowing: dict[int, dict] = {}
    lending: dict[int, dict] = {}
    for cohort_id, acc, n, bl, ll in CohortQuota.objects.values_list(
            "cohort_id", "accelerator_id", "nominal_gpus", "borrowing_limit_gpus", "lending_limit_gpus"):
        nominal.setdefault(cohort_id, {})[acc] = n
        borrowing.setdefault(cohort_id, {})[acc] = bl
        lending.setdefault(cohort_id, {})[acc] = ll
    parent = {pk: parent_id for pk, _, parent_id, _ in rows}
    root: dict[int, int] = {}
    for pk in parent:
        at, seen = pk, set()
        while parent.get(at) is not None and at not in seen:  # the API refuses loops; a stored one stops here
            seen.add(at)
            at = parent[at]
        root[pk] = at
    size: dict[int, int] = {}
    with_quota: set[int] = set()
    for pk, r in root.items():
        size[r] = size.get(r, 0) + 1
        if pk in nominal:
            with_quota.add(r)
    levels, root_of = {}, {}
    for pk, name, parent_id, weight in rows:
        r = root[pk]
        if not every and size[r] == 1 and r not in with_quota:
            continue
        levels[cohort_key(pk)] = cohorts.Level(cohort_key(pk), cohort_key(parent_id) if parent_id and pk != r else None,
                                       nominal.get(pk, {}), borrowing.get(pk, {}), lending.get(pk, {}),
                                       default_borrowing_limit=None, weight=float(weight), name=name)
        root_of[pk] = cohort_key(r)
    return levels, root_of


def team_level(team_id: int, cohort_id: int, quotas) -> cohorts.Level:
    """The leaf ``Level`` of team ``team_id`` of cohort ``cohort_id``: its team-wide GPU quotas (``quotas``: Quota
    rows) as nominal, borrowing and lending limits by accelerator id, keyed ``("team", id)``."""
    rows = [q for q in quotas if q.cluster_id is None]
    return cohorts.Level(("team", team_id), cohort_key(cohort_id), {q.accelerator_id: q.nominal_gpus for q in rows},
                         {q.accelerator_id: q.borrowing_limit_gpus for q in rows},
                         {q.accelerator_id: q.lending_limit_gpus for q in rows}, default_borrowing_limit=0)


class QueueingStrategy(models.TextChoices):
    """Kueue's ClusterQueue queueing strategies: how a team's queue treats a job that cannot be admitted now.

    ``BestEffortFIFO``: it waits and the jobs behind it that can be admitted
    are; ``StrictFIFO``: the team's queue stops at it (jobs that can never run
    are still rejected, and jobs that wait for the fleet to change still do
    not block).
    """

    BEST_EFFORT_FIFO = "BestEffortFIFO"
    STRICT_FIFO = "StrictFIFO"


class Team(models.Model):
    """A group of people that shares GPU quota and a budget; the unit of tenancy.

    ``cohort`` (null: the default cohort of all such teams) is whom it
    borrows from and lends to; ``weight`` (> 0, default 1) divides its
    dominant share, so a team of weight 2 may borrow twice as much before
    others go first (Kueue's fair-sharing weight); ``queueing_strategy`` is
    Kueue's (``QueueingStrategy``).
    """

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    cost_center = models.CharField(max_length=64, blank=True)
    cohort = models.ForeignKey(Cohort, on_delete=models.SET_NULL, null=True, blank=True, related_name="teams")
    weight = models.DecimalField(max_digits=8, decimal_places=3, default=Decimal("1"),
                                 validators=[MinValueValidator(Decimal("0.001"))])
    queueing_strategy = models.CharField(max_length=16, choices=QueueingStrategy.choices,
                                         default=QueueingStrategy.BEST_EFFORT_FIFO)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's role in a team: ``admin`` edits quotas and budgets, ``member`` submits, ``viewer`` reads."""

    class Role(models.TextChoices):
        ADMIN = "admin"
        MEMBER = "member"
        VIEWER = "viewer"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class OidcIdentity(models.Model):
    """The account a user of an OpenID Connect provider signs in to: one per (``issuer``, ``subject``).

    ``subject`` is the provider's ``sub`` claim, the one identifier it promises never to reassign (OpenID Connect
    Core 1.0, section 2); the email address is not one, so single sign-on never finds an account by email (ADR
    0032). ``groups`` is the groups claim of the latest sign-in and ``signed_in_at`` its time (UTC): at each
    sign-in ``quotas.sso`` sets the user's memberships and staff flag from it (``settings.OIDC_GROUP_MAP``).
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    groups = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    signed_in_at = models.DateTimeField()

    class Meta:
        verbose_name = "OpenID Connect identity"
        verbose_name_plural = "OpenID Connect identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique")]

    def __str__(self) -> str:
        return f"{self.user} ({self.subject} at {self.issuer})"


class ApiToken(models.Model):
    """A bearer token for ``Authorization: Token <key>``.

    Only the SHA-256 digest of the key is stored; the key itself is shown once,
    when :meth:`issue` creates it.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=8, help_text="First characters of the key, to recognise it")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_key(key: str) -> str:
        """SHA-256 hex digest of a token key."""
        return hashlib.sha256(key.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str, expires_at=None) -> tuple["ApiToken", str]:
        """Create a token for ``user``; returns ``(token, key)``. The key is not stored."""
        key = secrets.token_urlsafe(32)
        while key[0] in "-_":  # a key starting with "-" reads as an option on command lines (cpctl --token KEY)
            key = secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=key[:8], digest=cls.hash_key(key), expires_at=expires_at)
        return token, key

    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


#: The name of the CPU flavor's accelerator row (``runners.models.CPU_ACCELERATOR``; quotas and runners.models are
#: independent layers, so the name is repeated here).
CPU_FLAVOR = "CPU"


class Quota(models.Model):
    """A team's entitlement for one accelerator (optionally on one cluster): whole GPUs, or for the CPU flavor
    (``runners.models.CPU_ACCELERATOR``) whole vCPUs.

    ``nominal_gpus`` is guaranteed; ``borrowing_limit_gpus`` is how many more
    the team may use while others leave capacity idle (Kueue's
    ``nominalQuota`` and ``borrowingLimit``); ``lending_limit_gpus`` is how
    much of its nominal others may borrow (null: all of it; Kueue's
    ``lendingLimit``); ``max_gpus_per_job`` caps one job (0 means no cap
    beyond the quota).

    A row on the CPU flavor is a CPU quota, Kueue's ``cpu`` resource of that
    flavor, in vCPUs (1 vCPU = 1,000 millicores of pod requests): the same
    four numbers as ``nominal_vcpus``, ``borrowing_limit_vcpus``,
    ``lending_limit_vcpus`` and ``max_vcpus_per_job``; its GPU fields are 0
    (null lending limit), and a GPU row's vCPU fields are 0 (``clean``). A
    team without a CPU row runs CPU-only jobs quota-free; CPU rows are
    team-wide only (no ``cluster``). ADR 0012.

    A row with a ``cluster`` caps the team's GPUs of that accelerator on that
    cluster at its nominal plus borrowing limit: jobs go to other clusters,
    or wait with reason ``quota``, when it is full. It works inside the
    team-wide row (no cluster), which still decides admission and fair
    share; a team needs that row to run on the accelerator at all.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="quotas")
    accelerator = models.ForeignKey("runners.Accelerator", on_delete=models.PROTECT, related_name="quotas")
    cluster = models.ForeignKey("runners.Cluster", on_delete=models.CASCADE, null=True, blank=True, related_name="quotas")
    nominal_gpus = models.PositiveIntegerField(default=0)
    borrowing_limit_gpus = models.PositiveIntegerField(default=0)
    max_gpus_per_job = models.PositiveIntegerField(default=0)
    lending_limit_gpus = models.PositiveIntegerField(null=True, blank=True)
    nominal_vcpus = models.PositiveIntegerField(default=0, help_text="CPU flavor only: vCPUs guaranteed")
    borrowing_limit_vcpus = models.PositiveIntegerField(
        default=0, help_text="CPU flavor only: vCPUs the team may borrow from its cohort above nominal")
    max_vcpus_per_job = models.PositiveIntegerField(
        default=0, help_text="CPU flavor only: most vCPUs one job may ask (0: no cap beyond the quota)")
    lending_limit_vcpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="CPU flavor only: most of nominal others may borrow (empty: all of it)")

    class Meta:
        ordering = ["team__slug", "accelerator__name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "accelerator", "cluster"], name="quota_unique"),
            models.UniqueConstraint(
                fields=["team", "accelerator"], condition=models.Q(cluster__isnull=True), name="quota_unique_global"
            ),
        ]

    def __str__(self) -> str:
        if self.is_cpu:
            return f"{self.team} {self.accelerator}: {self.nominal_vcpus}+{self.borrowing_limit_vcpus} vCPUs"
        return f"{self.team} {self.accelerator}: {self.nominal_gpus}+{self.borrowing_limit_gpus}"

    @property
    def is_cpu(self) -> bool:
        """Whether this is a CPU quota (a row on the CPU flavor, counted in vCPUs)."""
        return self.accelerator_id is not None and self.accelerator.name == CPU_FLAVOR

    def clean(self):
        """``ValidationError`` by field when a CPU row carries GPU numbers or a cluster, a GPU row carries vCPU
        numbers, or a lending limit is over its nominal."""
        errors = quota_unit_errors(self.is_cpu, self.cluster_id is not None, {
            f: getattr(self, f) for f in (*GPU_QUOTA_FIELDS, *VCPU_QUOTA_FIELDS)})
        if errors:
            raise ValidationError(errors)

    @property
    def limit_gpus(self) -> int:
        """The most GPUs the team may hold at once: nominal plus borrowing limit."""
        return self.nominal_gpus + self.borrowing_limit_gpus

    @property
    def lendable_gpus(self) -> int:
        """The part of nominal others of the cohort may borrow: all of it, or at most the lending limit."""
        return cohorts.lendable(self.nominal_gpus, self.lending_limit_gpus)

    @property
    def limit_vcpus(self) -> int:
        """The most vCPUs the team may hold at once on a CPU row: nominal plus borrowing limit (0 on GPU rows)."""
        return self.nominal_vcpus + self.borrowing_limit_vcpus

    @property
    def lendable_vcpus(self) -> int:
        """The part of a CPU row's nominal vCPUs others of the cohort may borrow."""
        return cohorts.lendable(self.nominal_vcpus, self.lending_limit_vcpus)

    def _others_lendable(self, lendable) -> int:
        others = Quota.objects.filter(accelerator_id=self.accelerator_id, cluster__isnull=True).exclude(
            team_id=self.team_id)
        cohort_id = Team.objects.filter(pk=self.team_id).values_list("cohort_id", flat=True).first()
        others = others.filter(team__cohort_id=cohort_id) if cohort_id else others.filter(team__cohort__isnull=True)
        return sum(lendable(q) for q in others)

    def _tree_reachable(self) -> int | None:
        """The most the team can hold of this accelerator within every level of its tree of cohorts, nothing else in
        use (``core.cohorts.CohortTree.available``), or None for a team of a plain cohort. One query for a team
        without a cohort, three for one of a plain cohort, five in a tree."""
        cohort_id = Team.objects.filter(pk=self.team_id).values_list("cohort_id", flat=True).first()
        if cohort_id is None:  # the default cohort is never in a tree
            return None
        levels, root_of = cohort_levels()
        if cohort_id not in root_of:
            return None
        members = [c for c, r in root_of.items() if r == root_of[cohort_id]]
        rows = Quota.objects.filter(team__cohort_id__in=members, accelerator_id=self.accelerator_id,
                                    cluster__isnull=True).values_list("team_id", "team__cohort_id").distinct()
        by_team: dict[int, list] = {}
        for q in Quota.objects.filter(team_id__in=[t for t, _ in rows], accelerator_id=self.accelerator_id,
                                      cluster__isnull=True):
            by_team.setdefault(q.team_id, []).append(q)
        teams = dict(rows)
        leaves = [team_level(t, teams[t], qs) for t, qs in by_team.items()]
        if self.team_id not in teams:
            leaves.append(team_level(self.team_id, cohort_id, [self]))
        tree = cohorts.CohortTree([lv for k, lv in levels.items() if k[1] in members] + leaves)
        return tree.available(("team", self.team_id), self.accelerator_id, idle=True)

    def reachable_gpus(self) -> int:
        """The most GPUs the team can actually hold: nominal + borrowing limit, at most nominal + what the other
        teams of its cohort (all teams without one: ADR 0003) can lend of this accelerator; in a tree of cohorts,
        at most what every level above lets it hold (ADR 0046). A per-cluster row caps one cluster and borrows
        nothing: its limit. Three queries without a cohort, five or seven with one.

        The scheduler's core computes it with the same function (``core.cohorts.reachable``) from its snapshot.
        """
        if self.cluster_id is not None:
            return self.limit_gpus
        in_tree = self._tree_reachable()
        if in_tree is not None:  # a tree of cohorts: every level above bounds it (ADR 0046)
            return min(self.limit_gpus, in_tree)
        return cohorts.reachable(self.nominal_gpus, self.borrowing_limit_gpus,
                                 self._others_lendable(lambda q: q.lendable_gpus))

    def reachable_vcpus(self) -> int:
        """The most vCPUs the team can actually hold on a CPU row: nominal + borrowing limit, at most nominal + the
        vCPUs the other teams of its cohort can lend (their nominal, or their lending limit), as ``reachable_gpus``."""
        return cohorts.reachable(self.nominal_vcpus, self.borrowing_limit_vcpus,
                                 self._others_lendable(lambda q: q.lendable_vcpus))


#: The numbers of a GPU quota and of a CPU quota; a row uses one set, the other stays 0 (lending limits null).
GPU_QUOTA_FIELDS = ("nominal_gpus", "borrowing_limit_gpus", "max_gpus_per_job", "lending_limit_gpus")
VCPU_QUOTA_FIELDS = ("nominal_vcpus", "borrowing_limit_vcpus", "max_vcpus_per_job", "lending_limit_vcpus")


def quota_unit_errors(is_cpu: bool, has_cluster: bool, values: dict) -> dict[str, list[str]]:
    """Why a quota's numbers do not fit its accelerator, by field (empty: they do). ``values``: the fields of
    ``GPU_QUOTA_FIELDS`` and ``VCPU_QUOTA_FIELDS`` (ints or None). A CPU row counts vCPUs (GPU fields 0 or null)
    and is team-wide; a GPU row counts GPUs (vCPU fields 0 or null); a lending limit is at most its nominal."""
    errors: dict[str, list[str]] = {}
    wrong = GPU_QUOTA_FIELDS if is_cpu else VCPU_QUOTA_FIELDS
    for name in wrong:
        if values.get(name):
            errors[name] = [("a CPU quota counts vCPUs: give nominal_vcpus, borrowing_limit_vcpus, "
                             "max_vcpus_per_job and lending_limit_vcpus instead") if is_cpu else
                            "only a quota of the CPU accelerator counts vCPUs; a GPU quota counts GPUs"]
    if is_cpu and has_cluster:
        errors["cluster"] = ["a CPU quota is team-wide: per-cluster caps count GPUs"]
    unit = "vcpus" if is_cpu else "gpus"
    lending, nominal = values.get(f"lending_limit_{unit}"), values.get(f"nominal_{unit}") or 0
    if lending is not None and lending > nominal:
        errors[f"lending_limit_{unit}"] = [f"at most the nominal quota ({nominal})"]
    return errors


class Budget(models.Model):
    """A team's money for a period, in USD, with alert thresholds (percent of the amount).

    At 100 %, action ``alert`` only raises an alert; ``block`` stops new
    admissions whose estimated cost would not fit what remains (running jobs
    continue unless ``stop_running`` is set).
    """

    class Period(models.TextChoices):
        MONTHLY = "monthly"
        QUARTERLY = "quarterly"
        CUSTOM = "custom"

    class Action(models.TextChoices):
        ALERT = "alert"
        BLOCK = "block"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budgets")
    period = models.CharField(max_length=16, choices=Period.choices, default=Period.MONTHLY)
    # Only for period=custom: [starts_at, ends_at).
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    amount_usd = models.DecimalField(max_digits=14, decimal_places=2)
    alert_thresholds = models.JSONField(default=list, blank=True, help_text="Percent of the amount, e.g. [50, 80, 100]")
    action = models.CharField(max_length=8, choices=Action.choices, default=Action.ALERT)
    stop_running = models.BooleanField(default=False)

    class Meta:
        ordering = ["team__slug", "period"]

    def __str__(self) -> str:
        return f"{self.team} {self.period} ${self.amount_usd} ({self.action})"

    def save(self, *args, **kwargs):
        if not self.alert_thresholds:
            self.alert_thresholds = [50, 80, 100]
        super().save(*args, **kwargs)

    def window(self, at=None):
        """The ``[start, end)`` of the period that contains ``at`` (default now), as aware UTC datetimes.

        Monthly periods are calendar months, quarterly periods calendar
        quarters (Jan, Apr, Jul, Oct), custom periods the stored dates.
        """
        at = at or timezone.now()
        if self.period == self.Period.CUSTOM:
            return self.starts_at, self.ends_at
        at = at.astimezone(dt.timezone.utc)
        months = 1 if self.period == self.Period.MONTHLY else 3
        first_month = ((at.month - 1) // months) * months + 1
        start = at.replace(month=first_month, day=1, hour=0, minute=0, second=0, microsecond=0)
        end_month = first_month + months
        end = start.replace(year=start.year + (end_month - 1) // 12, month=(end_month - 1) % 12 + 1)
        return start, end

    def contains(self, at) -> bool:
        start, end = self.window(at)
        return start <= at < end



class PriorityClass(models.Model):
    """A named job priority (``low`` 100, ``normal`` 500, ``high`` 1000 by default); higher values go first.

    Job specs name a class; the job stores its value (Kubernetes'
    PriorityClass, as Kueue's WorkloadPriorityClass).
    """

    name = models.SlugField(max_length=63, unique=True)
    value = models.IntegerField(unique=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["value"]
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return f"{self.name} ({self.value})"


PRIORITY_CLASS_CACHE = LookupCache("priority-classes").invalidate_on(PriorityClass)
# The default priority classes, name -> value (migration 0003 seeds the same rows); jobs default to ``normal``.
DEFAULT_PRIORITY_CLASSES = {"low": 100, "normal": 500, "high": 1000}


def priority_classes() -> dict[str, int]:
    """Priority class names and values from the PriorityClass table; ``DEFAULT_PRIORITY_CLASSES`` if it is empty.

    The fallback keeps job submission working on a database whose seeded rows
    were flushed (test databases of transactional tests).
    """
    rows = PRIORITY_CLASS_CACHE.get("all", lambda: dict(PriorityClass.objects.values_list("name", "value")) or None)
    if rows:
        return dict(rows)
    return dict(DEFAULT_PRIORITY_CLASSES)


class AuditRecordQuerySet(models.QuerySet):
    """Bulk changes of audit records are refused too: ``update`` and ``delete`` raise ``AuditRecord.AppendOnly``."""

    def update(self, **kwargs):
        raise AuditRecord.AppendOnly("audit records are append-only: they cannot be changed")

    def delete(self):
        raise AuditRecord.AppendOnly("audit records are append-only: they cannot be deleted")


class AuditRecord(models.Model):
    """One change of a governed object, append-only: who (``actor``, and ``actor_name`` kept as text), when
    (``at``, UTC), what (``action`` on ``object_type`` ``object_id``, ``object_repr``), whose (``team``: the
    team the object belongs to, null for platform-wide objects), the audited values ``before`` and ``after``
    (``quotas.audit.snapshot``: money as Decimal strings, credentials never, only the fact that they changed)
    and the ``reason`` given. ADR 0031.

    Rows are written by ``quotas.audit.record`` in the change's own transaction and never changed or deleted:
    ``save`` of a stored row and ``delete`` raise ``AuditRecord.AppendOnly``; on PostgreSQL a trigger refuses
    UPDATE and DELETE as well (migration 0008). ``actor`` and ``team`` have no database constraint and no
    cascade: deleting a user or a team keeps their records (``actor_name`` and ``object_repr`` still say who and
    what).
    """

    class AppendOnly(Exception):
        """Raised on an attempt to change or delete a stored audit record."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False,
                              null=True, blank=True, related_name="+")
    actor_name = models.CharField(max_length=150, blank=True, help_text="the actor's username; empty: the system")
    action = models.CharField(max_length=16)
    object_type = models.CharField(max_length=32)
    object_id = models.PositiveBigIntegerField()
    object_repr = models.CharField(max_length=200)
    team = models.ForeignKey(Team, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True,
                             related_name="+")
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    reason = models.TextField(max_length=2000, blank=True)

    objects = AuditRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["team", "at"], name="auditrecord_team_at"),
                   models.Index(fields=["object_type", "object_id"], name="auditrecord_object")]

    def __str__(self) -> str:
        return f"{self.action} {self.object_type} {self.object_repr}"

    @property
    def changes(self) -> list[tuple[str, object, object]]:
        """``(field, before, after)`` of every audited field whose value differs (a creation: every field, before
        None; a deletion: every field, after None), in field order."""
        names = list(self.before) + [name for name in self.after if name not in self.before]
        return [(name, self.before.get(name), self.after.get(name)) for name in names
                if self.before.get(name) != self.after.get(name)]

    def save(self, *args, **kwargs):
        """Insert a new record; ``AuditRecord.AppendOnly`` for a stored one."""
        if self.pk is not None:
            raise self.AppendOnly(f"audit record {self.pk} is append-only: it cannot be changed")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        """Always ``AuditRecord.AppendOnly``: records are kept."""
        raise self.AppendOnly(f"audit record {self.pk} is append-only: it cannot be deleted")


class ChangeRequest(models.Model):
    """A team admin's request for a quota or budget change, with a reason, that platform staff approve or decline.

    ``kind`` names the object (``quota`` or ``budget``); ``target_id`` the team's object to change (null: a new
    one); ``payload`` the requested values, as the staff write path takes them (``quotas.serializers``: a
    PATCH of the target, or the body of a create without ``team``), validated when requested and again when
    approved; ``base`` the target's values when requested (``quotas.changes.current_values``: approval refuses
    when they changed since). ``state`` moves once from ``pending`` to ``approved``, ``declined`` or
    ``withdrawn``, by compare-and-set with a ``ChangeRequestEvent`` in the same transaction
    (``quotas.changes``); ``applied_id`` is the object an approval created or changed. ADR 0029.
    """

    class Kind(models.TextChoices):
        QUOTA = "quota"
        BUDGET = "budget"

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DECLINED = "declined"
        WITHDRAWN = "withdrawn"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="change_requests")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    target_id = models.PositiveBigIntegerField(null=True, blank=True,
                                               help_text="the quota or budget to change; empty: a new one")
    payload = models.JSONField(default=dict, help_text="the requested values, as the staff write path takes them")
    base = models.JSONField(default=dict, blank=True, help_text="the target's values when the change was requested")
    reason = models.TextField(max_length=2000)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                     related_name="change_requests")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(max_length=2000, blank=True)
    applied_id = models.PositiveBigIntegerField(null=True, blank=True,
                                                help_text="the quota or budget the approval created or changed")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "created_at"], name="changerequest_state_created")]
        constraints = [
            models.CheckConstraint(condition=models.Q(state__in=["pending", "approved", "declined", "withdrawn"]),
                                   name="changerequest_state_valid"),
            models.CheckConstraint(condition=models.Q(kind__in=["quota", "budget"]), name="changerequest_kind_valid"),
        ]

    def __str__(self) -> str:
        what = f"{self.kind} {self.target_id}" if self.target_id else f"new {self.kind}"
        return f"request {self.pk}: {what} of {self.team} ({self.state})"


class ChangeRequestEvent(models.Model):
    """One state change of a change request (``from_state`` empty: its creation): who, when, the note. Append-only."""

    request = models.ForeignKey(ChangeRequest, on_delete=models.CASCADE, related_name="events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    note = models.TextField(max_length=2000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"request {self.request_id}: {self.from_state or 'new'} -> {self.to_state}"


class TeamUsage(models.Model):
    """A team's decayed GPU usage for fair sharing over time (docs/adr/0045-fair-sharing-over-time.md): ``gpu_seconds``
    is the integral of the GPUs its attempts held (milli-GPU exact) weighted by ``2 ** (-age / half-life)``, as of
    ``sampled_at`` (``jobs.scheduling.core.usage.advance``; the half-life is ``FAIR_SHARING_USAGE_HALF_LIFE_SECONDS``).

    One row per team, moved forward by ``jobs.scheduling.usage.sample_usage`` with a compare-and-set on
    ``sampled_at``; a team without a row has used nothing since sampling began.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, primary_key=True, related_name="usage")
    gpu_seconds = models.DecimalField(max_digits=30, decimal_places=9, default=Decimal("0"),
                                      validators=[MinValueValidator(Decimal("0"))])
    sampled_at = models.DateTimeField()

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(gpu_seconds__gte=0), name="teamusage_nonnegative")]

    def __str__(self) -> str:
        return f"{self.team_id}: {self.gpu_seconds} decayed GPU-seconds at {self.sampled_at.isoformat()}"
