"""Cohort arithmetic of Kueue's ClusterQueue/Cohort model, written once: what part of a nominal quota a team
lends, and the most a team can reach.

Pure functions over whole numbers (GPUs, or vCPUs / CPU millicores for a CPU quota: the unit is the caller's and
the same on every argument). The scheduling core (``jobs.scheduling.core.cohort``) and the quota rows
(``quotas.models.Quota``) both ask these, so the API, the UI, the submission checks and admission say the same
number. Sources: Kueue's "Cluster Queue" and "Cohort" concepts (nominalQuota, borrowingLimit, lendingLimit);
docs/adr/0003-borrowing-from-idle-nominal-quota.md.
"""

from __future__ import annotations


def lendable(nominal: int, lending_limit: int | None) -> int:
    """The part of ``nominal`` the other teams of the cohort may borrow: all of it without a lending limit, else at
    most the lending limit (Kueue's ``lendingLimit``). Never negative for non-negative arguments."""
    return nominal if lending_limit is None else min(lending_limit, nominal)


def reachable(nominal: int, borrowing_limit: int, lendable_by_others: int) -> int:
    """The most a team can ever hold: its nominal, plus what it may borrow, which is at most what the other teams
    of its cohort can lend: ``nominal + min(borrowing_limit, max(lendable_by_others, 0))``."""
    return nominal + min(borrowing_limit, max(lendable_by_others, 0))


# --- hierarchical cohorts (ADR 0046) --------------------------------------------------------------------------

class Level:
    """One level of a tree of cohorts: a cohort, or a team (a leaf), with its quota by accelerator.

    ``key``: any hashable, unique in the tree (``("cohort", id)``, ``("team", id)``); ``parent``: its parent's key
    (None: a root); ``nominal``: nominal quota by accelerator id (whole GPUs, or the caller's unit);
    ``borrowing_limit`` / ``lending_limit``: by accelerator id, an int or None (no limit); an accelerator missing
    from ``borrowing_limit`` has ``default_borrowing_limit`` (a team: 0, it borrows only what its quota row says;
    a cohort: None, Kueue's default); one missing from ``lending_limit`` lends everything. ``weight`` (> 0): its
    fair-sharing weight among its siblings; ``name``: what messages call it (default: the key). Source: Kueue's Cohort and ClusterQueue specs (nominalQuota,
    borrowingLimit, lendingLimit, parentName, fairSharing.weight).
    """

    __slots__ = ("key", "parent", "nominal", "borrowing_limit", "lending_limit", "default_borrowing_limit", "weight",
                 "name")

    def __init__(self, key, parent=None, nominal=None, borrowing_limit=None, lending_limit=None,
                 default_borrowing_limit: int | None = None, weight: float = 1.0, name: str = ""):
        self.key, self.parent, self.name = key, parent, name or str(key)
        self.nominal = dict(nominal or {})
        self.borrowing_limit = dict(borrowing_limit or {})
        self.lending_limit = dict(lending_limit or {})
        self.default_borrowing_limit = default_borrowing_limit
        self.weight = weight

    def __repr__(self) -> str:
        return f"Level({self.key!r}, parent={self.parent!r}, nominal={self.nominal!r})"

    def limit_to_borrow(self, acc) -> int | None:
        """The borrowing limit on ``acc`` (None: none)."""
        return self.borrowing_limit.get(acc, self.default_borrowing_limit)


class CohortTree:
    """Kueue's hierarchical quota arithmetic over a forest of ``Level``s, with live usage of the leaves.

    For each level and accelerator: the subtree quota ``S`` (its nominal plus what each child puts in: the
    child's ``S`` less the child's guaranteed part), the guaranteed part ``g`` (``max(0, S - lending limit)``
    with a lending limit, else 0: what the level keeps from outsiders) and the usage ``U`` (a leaf: what it
    holds; a cohort: what its children hold above their guaranteed parts, ``sum(max(0, U_child - g_child))``).
    ``available`` is Kueue's: a root can give ``S - U``; any other level its unused guaranteed part plus what
    its parent can give, at most (with a borrowing limit) ``S - g - max(0, U - g) + borrowing limit``. A leaf
    may take ``amount`` more when ``amount <= available``. Source: Kueue pkg/cache ``resource_node.go``
    (``calculateSubtreeQuota``, ``guaranteedQuota``, ``addUsage``, ``available``), docs "Hierarchical Cohorts".

    ``levels``: every level (parents before or after children); raises ValueError for an unknown parent or a
    loop. ``usage``: a leaf's usage by ``(key, accelerator id)``. Amounts are ints, or Decimals where a share of
    a GPU counts (exact sums).
    """

    def __init__(self, levels, usage: dict | None = None):
        self.levels: dict = {lv.key: lv for lv in levels}
        self.children: dict = {k: [] for k in self.levels}
        for lv in self.levels.values():
            if lv.parent is not None:
                if lv.parent not in self.levels:
                    raise ValueError(f"level {lv.key!r} names an unknown parent {lv.parent!r}")
                self.children[lv.parent].append(lv.key)
        self.depth: dict = {}
        for k in self.levels:
            seen, at = [], k
            while at is not None and at not in self.depth:
                if at in seen:
                    raise ValueError(f"the parents of {k!r} loop")
                seen.append(at)
                at = self.levels[at].parent
            base = -1 if at is None else self.depth[at]
            for i, node in enumerate(reversed(seen)):
                self.depth[node] = base + 1 + i
        self.bottom_up = sorted(self.levels, key=lambda k: -self.depth[k])
        self.leaf_usage: dict = dict(usage or {})
        self._acc: dict = {}  # acc -> (S, g, U)

    def _tables(self, acc):
        tables = self._acc.get(acc)
        if tables is None:
            S, g, U = {}, {}, {}
            for k in self.bottom_up:
                lv = self.levels[k]
                s = lv.nominal.get(acc, 0) + sum(S[c] - g[c] for c in self.children[k])
                ll = lv.lending_limit.get(acc)
                S[k], g[k] = s, (max(0, s - ll) if ll is not None else 0)
                kids = self.children[k]
                U[k] = (sum(max(0, U[c] - g[c]) for c in kids) if kids else self.leaf_usage.get((k, acc), 0))
            tables = self._acc[acc] = (S, g, U)
        return tables

    def subtree_quota(self, key, acc):
        """``S`` of ``key`` on ``acc``: its nominal plus what its children put in."""
        return self._tables(acc)[0][key]

    def guaranteed(self, key, acc):
        """``g`` of ``key`` on ``acc``: the part of ``S`` it never lends (0 without a lending limit)."""
        return self._tables(acc)[1][key]

    def usage(self, key, acc):
        """``U`` of ``key`` on ``acc``: a leaf's usage; a cohort's: what its children hold above their ``g``."""
        return self._tables(acc)[2][key]

    def path(self, key) -> list:
        """``key`` and its ancestors, the root last."""
        out = []
        while key is not None:
            out.append(key)
            key = self.levels[key].parent
        return out

    def root(self, key):
        """The root of ``key``'s tree."""
        return self.path(key)[-1]

    def subtree(self, key) -> list:
        """``key`` and every level below it."""
        out, todo = [], [key]
        while todo:
            k = todo.pop()
            out.append(k)
            todo.extend(self.children[k])
        return out

    def add(self, key, acc, delta) -> None:
        """Leaf ``key`` holds ``delta`` more of ``acc`` (negative: less); every ancestor's usage follows."""
        S, g, U = self._tables(acc)
        self.leaf_usage[(key, acc)] = self.leaf_usage.get((key, acc), 0) + delta
        before = U[key]
        U[key] = before + delta
        child = key
        parent = self.levels[key].parent
        while parent is not None:
            old = max(0, before - g[child])
            new = max(0, U[child] - g[child])
            if old == new:
                return
            before = U[parent]
            U[parent] = before + new - old
            child, parent = parent, self.levels[parent].parent

    def available(self, key, acc, *, idle: bool = False):
        """What ``key`` may take more of ``acc`` now (Kueue's ``available``; never below 0); ``idle``: as if
        nothing were in use (the most it can ever hold: its reachable quota)."""
        S, g, U = self._tables(acc)
        return max(0, self._available(key, acc, S, g, {} if idle else U))

    def _available(self, key, acc, S, g, U):
        lv = self.levels[key]
        used = U.get(key, 0)
        if lv.parent is None:
            return S[key] - used
        local = max(0, g[key] - used)
        above = self._available(lv.parent, acc, S, g, U)
        limit = lv.limit_to_borrow(acc)
        if limit is not None:
            above = min(above, S[key] - g[key] - max(0, used - g[key]) + limit)
        return local + above

    def fits(self, key, acc, amount) -> bool:
        """Whether leaf ``key`` may take ``amount`` more of ``acc`` within every level above it."""
        return amount <= self.available(key, acc)

    def room(self, key, acc):
        """How much more ``key``'s own limit lets it use on ``acc``, in its own accounting: ``S + borrowing limit -
        U`` (None: no borrowing limit), for a root ``S - U``. For messages: the level of a path with the least room
        is the one that holds a request back."""
        S, g, U = self._tables(acc)
        lv = self.levels[key]
        if lv.parent is None:
            return S[key] - U[key]
        limit = lv.limit_to_borrow(acc)
        return None if limit is None else S[key] + limit - U[key]

    def short_level(self, key, acc, amount):
        """The level on ``key``'s path (``key`` itself included) with the least ``room``, nearest the root on a
        tie, when ``key`` may not take ``amount`` more of ``acc``; None when it may."""
        if self.fits(key, acc, amount):
            return None
        best, least = None, None
        for k in self.path(key):
            r = self.room(k, acc)
            if r is not None and (least is None or r <= least):
                best, least = k, r
        return best

    def share(self, key, acc) -> float:
        """What ``key`` borrows above its subtree quota (``max(0, U - S)``) over what its parent holds to lend
        (the parent's ``S``), divided by its weight: Kueue's dominant resource share of one level on one
        accelerator (infinite when it borrows from a parent with nothing; 0 for a root)."""
        lv = self.levels[key]
        if lv.parent is None:
            return 0.0
        S, g, U = self._tables(acc)
        above = U[key] - S[key]
        if above <= 0:
            return 0.0
        pool = S[lv.parent]
        share = float(above) / pool if pool else float("inf")
        return share / lv.weight if lv.weight > 0 else float("inf")
