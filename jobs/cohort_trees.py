"""Trees of cohorts with their usage per level, as the API, the web UI and the CLI show them (ADR 0046).

Each cohort shows, per GPU accelerator: its own quota (nominal, borrowing and lending limits), the nominal quota
inside its subtree (its own and every cohort's and team's below it), the GPUs its subtree's teams hold (summed
from the live attempts, as admission counts them), what it borrows from outside (held above the nominal inside)
and the arithmetic of the tree (subtree quota and guaranteed part, ``core.cohorts.CohortTree``); its children and
its teams below it. The tree's shape and each cohort's own quota are every reader's, as the cohorts are; a
team's quota, usage and what it could take now only its members' and staff's; and a level's figures summed over
its subtree (nominal inside it, usage, borrowing, subtree quota, guaranteed part) only the readers' who may see
every team below it (staff, or a member of each): a sum over teams one may not see, less the ones one may, would
give their figures away.
"""

from __future__ import annotations

from django.db.models import Sum

from core.cohorts import CohortTree
from core.gpus import exact_gpus, shown_gpus
from quotas.models import Quota, Team, cohort_key, cohort_levels, team_level
from runners.models import CPU_ACCELERATOR, Accelerator

from .models import HELD_GPU_MILLI, JobAttempt


def cohort_forest(user, root_id: int | None = None) -> list[dict]:
    """Every tree of cohorts (``root_id``: the subtree of that cohort only; [] when there is none), each cohort
    as ``{"id", "name", "parent", "weight", "accelerators": [...], "children": [...], "teams": [...]}``; GPU
    amounts are numbers (``core.gpus.shown_gpus``). ``user``: the reader; a team's figures are null unless the
    reader is staff or a member of it, and a level's subtree sums unless the reader may see every team below it
    (module docstring). Seven queries."""
    levels, _ = cohort_levels(every=True)
    if root_id is not None and cohort_key(root_id) not in levels:
        return []
    rows = list(Team.objects.filter(cohort__isnull=False).values_list("pk", "cohort_id", "slug"))
    teams = {pk: cohort_id for pk, cohort_id, _ in rows}
    slugs = {pk: slug for pk, _, slug in rows}
    quotas: dict[int, list] = {}
    for q in Quota.objects.filter(team_id__in=teams, cluster__isnull=True).exclude(
            accelerator__name=CPU_ACCELERATOR):
        quotas.setdefault(q.team_id, []).append(q)
    usage = {}
    for team_id, acc, milli in (JobAttempt.objects.filter(job__team_id__in=teams, ended_at__isnull=True)
                                .exclude(node_pool__accelerator__name=CPU_ACCELERATOR)
                                .values_list("job__team_id", "node_pool__accelerator_id")
                                .annotate(n=Sum(HELD_GPU_MILLI))):
        usage[(("team", team_id), acc)] = exact_gpus(milli)
    leaves = [team_level(t, c, quotas.get(t, [])) for t, c in teams.items()]
    tree = CohortTree([*levels.values(), *leaves], usage)
    accs = sorted({a for lv in tree.levels.values() for a in lv.nominal} | {a for _, a in usage})
    names = dict(Accelerator.objects.filter(pk__in=accs).values_list("pk", "name"))
    mine = set(teams) if user.is_staff else set(user.memberships.values_list("team_id", flat=True))

    def nominal_in(key, acc):
        return sum(tree.levels[k].nominal.get(acc, 0) for k in tree.subtree(key))

    def used_in(key, acc):
        return sum(tree.leaf_usage.get((k, acc), 0) for k in tree.subtree(key))

    def sees(key) -> bool:
        """Whether the reader may see every team of ``key``'s subtree (staff, or a member of each)."""
        return all(k[1] in mine for k in tree.subtree(key) if k[0] == "team")

    def team_row(key):
        lv, tid = tree.levels[key], key[1]
        shown = tid in mine
        return {"slug": slugs.get(tid), "accelerators": [
            {"accelerator": names[acc], "nominal_gpus": lv.nominal.get(acc, 0) if shown else None,
             "borrowing_limit_gpus": lv.limit_to_borrow(acc) if shown else None,
             "lending_limit_gpus": lv.lending_limit.get(acc) if shown else None,
             "used_gpus": shown_gpus(tree.leaf_usage.get((key, acc), 0)) if shown else None,
             "available_gpus": shown_gpus(tree.available(key, acc)) if shown else None}
            for acc in accs if acc in lv.nominal]}

    def cohort_row(key):
        lv = tree.levels[key]
        rows = []
        shown = sees(key)
        for acc in accs:
            nominal, used = nominal_in(key, acc), used_in(key, acc)
            if not nominal and not used and acc not in lv.nominal:
                continue
            rows.append({"accelerator": names[acc], "nominal_gpus": lv.nominal.get(acc, 0),
                         "borrowing_limit_gpus": lv.limit_to_borrow(acc), "lending_limit_gpus": lv.lending_limit.get(acc),
                         "nominal_in_subtree_gpus": nominal if shown else None,
                         "used_gpus": shown_gpus(used) if shown else None,
                         "borrowed_gpus": shown_gpus(max(0, used - nominal)) if shown else None,
                         "subtree_quota_gpus": shown_gpus(tree.subtree_quota(key, acc)) if shown else None,
                         "guaranteed_gpus": shown_gpus(tree.guaranteed(key, acc)) if shown else None})
        kids = sorted(tree.children[key], key=lambda k: (k[0] != "cohort", tree.levels[k].name, k[1]))
        return {"id": key[1], "name": lv.name, "parent": tree.levels[lv.parent].name if lv.parent else None,
                "weight": lv.weight, "accelerators": rows,
                "children": [cohort_row(k) for k in kids if k[0] == "cohort"],
                "teams": sorted((team_row(k) for k in kids if k[0] == "team"), key=lambda r: r["slug"] or "")}

    if root_id is not None:
        return [cohort_row(cohort_key(root_id))]
    roots = sorted((k for k, lv in levels.items() if lv.parent is None), key=lambda k: tree.levels[k].name)
    return [cohort_row(k) for k in roots]
