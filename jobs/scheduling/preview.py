"""What the submission form shows before a job exists: where it would run now, its estimated cost, and whether its
team's quota and budget allow it, as the core's rules say (``core.assess``)."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from quotas.models import Team

from .core import Assessment, QueuedJob, assess
from .offers import pool_offers
from .snapshot import job_snapshot, per_node_request, pods_of


def preview_submission(team: Team, resources: dict, placement: dict, now: dt.datetime | None = None,
                       kind: str = "training") -> Assessment:
    """The core's assessment of a job not yet stored, for ``team``.

    ``resources``: the validated submission's ``accelerator`` (instance),
    ``gpus_per_node``, ``nodes``, ``priority``, ``preemptible`` and
    ``max_runtime_seconds`` (s), and optional ``cpu`` (cores) and
    ``memory_gib`` per node and ``replicas`` (default 1); ``placement``: its
    ``providers``, ``regions`` and ``clusters`` lists; ``kind``: training or
    inference (whose replicas may share a node: ``snapshot.pods_of``). Placement is the scheduler's (cheapest matching
    pool with nodes with room; if none has room, the cheapest that matches,
    where it would wait for capacity); the estimate is GPUs x max runtime x
    that pool's price (USD); the quota verdict is on the limit the team can
    reach (nominal + borrowing limit, at most what its cohort can lend: the
    number every view shows); how much the cohort lends now is decided at
    admission.
    """
    now = now or timezone.now()
    accelerator = resources["accelerator"]
    cpu, memory = per_node_request(resources)
    pods, share = pods_of(kind, resources["nodes"], resources.get("replicas", 1))
    job = QueuedJob(
        job_id=0, team_id=team.pk, accelerator_id=accelerator.pk, nodes=pods, share_nodes=share,
        gpus_per_node=resources["gpus_per_node"], priority=resources["priority"], submitted=now.timestamp(),
        preemptible=resources["preemptible"], max_runtime_seconds=resources["max_runtime_seconds"],
        providers=tuple(placement.get("providers") or ()), regions=tuple(placement.get("regions") or ()),
        clusters=tuple(placement.get("clusters") or ()), cpu_milli=cpu, memory_mib=memory,
    )
    unpriced: list = []
    snapshot = job_snapshot(team, job, now, pool_offers(accelerator.pk, now, lock=False, unpriced=unpriced))
    snapshot.unpriced = {accelerator.pk: unpriced}  # so a job only unpriced pools could hold is told so
    return assess(snapshot, job)
