"""Named scenarios: each failure class the simulator or a user found, as the shortest world and action list that
broke its invariant before the fix. ``REGRESSIONS`` maps a name to ``(config, actions, invariants)``: playing the
actions must break none of ``invariants`` (nor any other). ``tests/simulation`` plays every one of them.
"""

from __future__ import annotations

from .world import ClusterConfig, WorldConfig

#: (nodes, GPUs per node) index of a 1 x 2 GPU job in ``scenario.SHAPES``.
ONE_BY_TWO = 1


def admit_preempt_loop() -> tuple[WorldConfig, list[tuple]]:
    """One node of 3 GPUs; team a has nominal 1 and may borrow 1, team b has nominal 2. Every 20 s each team
    submits a preemptible 1 x 2 GPU job that runs 30 s, team a first: a's job is admitted by borrowing, and
    b's, within its nominal quota, reclaims the GPUs before a's was dispatched, again and again."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 3, "2.00"),), nominal=(1, 2), borrowing=(1, 0))
    actions: list[tuple] = []
    for _ in range(20):
        actions += [("submit", 0, ONE_BY_TWO, 0, 1, 30, 0, 1), ("submit", 1, ONE_BY_TWO, 0, 1, 40, 0, 1),
                    ("advance", 10), ("advance", 10)]
    return config, actions


def unreadable_credential() -> tuple[WorldConfig, list[tuple]]:
    """Two clusters, a job on each; one cluster's stored credential becomes unreadable (encrypted under another
    key) while the jobs run and end: the other cluster's job is still seen to end, the API still answers."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "2.00"),
                          ClusterConfig("c1", "gcp", "on-demand", 1, 8, "2.50")), nominal=(8, 8), borrowing=(0, 0))
    return config, [("submit", 0, 3, 0, 0, 60, 0, 1), ("submit", 1, 3, 0, 0, 60, 0, 1), ("advance", 10),
                    ("credential_unreadable", 1, 300), ("advance", 120), ("advance", 120)]


def control_plane_outage() -> tuple[WorldConfig, list[tuple]]:
    """A job runs; the control plane is down for longer than every grace period, and the cluster's API server
    stops answering just after it went down, until 30 s after it is back: the cluster fails its first looks after
    the restart. The grace must count only watched time: the job is not recovered, its pods not deleted."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "2.00"),
                          ClusterConfig("c1", "gcp", "on-demand", 1, 8, "2.50")), nominal=(8, 8), borrowing=(0, 0))
    return config, [("submit", 0, 3, 0, 0, 3000, 0, 1), ("advance", 30), ("cluster_outage", 0, 1530),
                    ("control_plane_outage", 1500), ("advance", 30), ("advance", 60)]


def spot_reclaim_return() -> tuple[WorldConfig, list[tuple]]:
    """Two spot clusters of one 8-GPU node ($1.00 and $1.20); a preemptible 1 x 8 job on the cheaper one; its node
    is reclaimed and a replacement joins the same cluster: the next attempt goes to the other cluster."""
    config = WorldConfig((ClusterConfig("c0", "aws", "spot", 1, 8, "1.00"),
                          ClusterConfig("c1", "gcp", "spot", 1, 8, "1.20")), nominal=(8, 8), borrowing=(0, 0))
    return config, [("submit", 0, 3, 0, 1, 600, 0, 1), ("advance", 30), ("spot_reclaim", 0, 0, 1), ("advance", 60),
                    ("advance", 60)]


def replicas_share_nodes() -> tuple[WorldConfig, list[tuple]]:
    """An inference job of 3 replicas x 2 GPUs on a pool of 2 nodes x 8 GPUs: accepted, so it must be placed."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 2, 8, "2.00"),), nominal=(16, 16), borrowing=(0, 0))
    return config, [("submit", 0, ONE_BY_TWO, 1, 0, 60, 0, 3), ("advance", 30), ("advance", 60)]


def billed_past_the_end() -> tuple[WorldConfig, list[tuple]]:
    """A job's cluster stops answering and the job ends meanwhile; the ledger must not bill the time after its
    pods' end, which reconcile learns only when the cluster answers again."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "2.00"),), nominal=(8, 8), borrowing=(0, 0))
    return config, [("submit", 0, ONE_BY_TWO, 0, 0, 60, 0, 1), ("advance", 20), ("cluster_outage", 0, 300),
                    ("advance", 120), ("advance", 120), ("advance", 120)]


def restore_from_backup() -> tuple[WorldConfig, list[tuple]]:
    """Two clusters; a job runs, the database is backed up, a second job starts and the first ends, then the
    database is restored from the backup: nothing running is killed or started twice, and the gap is billed
    from the clusters' own times."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "2.00"),
                          ClusterConfig("c1", "gcp", "on-demand", 1, 8, "2.50")), nominal=(8, 8), borrowing=(8, 8))
    return config, [("submit", 0, 3, 0, 0, 90, 0, 1), ("advance", 30), ("backup",), ("submit", 1, 3, 0, 0, 600, 0, 1),
                    ("advance", 120), ("restore",), ("advance", 60), ("advance", 60)]


def preempted_pods_still_stopping() -> tuple[WorldConfig, list[tuple]]:
    """Three clusters of one 8-GPU node; team a's preemptible job runs on the cheapest, whose pods take 120 s to
    stop once deleted; team b fills the two others, then reclaims a's GPUs. When b's short job ends, a's job is
    placed again on the freed cluster: it must not start while its preempted pods still run."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "1.00"),
                          ClusterConfig("c1", "gcp", "on-demand", 1, 8, "2.00"),
                          ClusterConfig("c2", "aws", "on-demand", 1, 8, "3.00")), nominal=(1, 24), borrowing=(24, 0))
    return config, [("slow_termination", 0, 120), ("submit", 0, 3, 0, 1, 3000, 0, 1), ("advance", 10),
                    ("submit", 1, 3, 0, 0, 60, 0, 1), ("submit", 1, 3, 0, 0, 3000, 0, 1), ("advance", 10),
                    ("submit", 1, 3, 0, 0, 3000, 0, 1), ("advance", 30), ("advance", 30), ("advance", 30),
                    ("advance", 60), ("advance", 60)]


def end_record_behind_the_stop() -> tuple[WorldConfig, list[tuple]]:
    """A job runs on one 8-GPU node whose pods take 30 s to stop once deleted; the database is backed up, the job
    is cancelled (its end record written before the DELETE, with the cancel's instant as the end), its pods run
    out their grace (the attempt's end moves to their stop), then the database is restored from the backup: the
    restored attempt ends, and is billed, where the live one was, as the cluster's end record must say."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "2.00"),), nominal=(8, 8), borrowing=(0, 0))
    return config, [("slow_termination", 0, 30), ("submit", 0, 3, 0, 0, 600, 0, 1), ("advance", 30), ("backup",),
                    ("cancel", 0), ("advance", 60), ("restore",), ("advance", 60)]


def waiting_at_backup_started_in_the_gap() -> tuple[WorldConfig, list[tuple]]:
    """One 8-GPU node; a job runs and a second one waits for it; the database is backed up; the first ends and the
    second starts; the database is restored from the backup, where the second still waits: its running attempt
    must be adopted onto it, not listed for staff while the scheduler admits it a second time."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 8, "2.00"),), nominal=(8, 8), borrowing=(0, 0))
    return config, [("submit", 0, 3, 0, 0, 60, 0, 1), ("submit", 0, 3, 0, 0, 600, 0, 1), ("advance", 30),
                    ("backup",), ("advance", 60), ("advance", 30), ("restore",), ("advance", 60), ("advance", 60)]


def array_across_a_restore() -> tuple[WorldConfig, list[tuple]]:
    """Two 8-GPU nodes; a sweep of 4 one-node 8-GPU elements, 2 at once; the database is backed up while the first
    two run; they end and the next two start; the database is restored: the two started in the gap are adopted
    as the array's elements, not made and run again, and the array still ends with each element run once."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 2, 8, "2.00"),), nominal=(16, 16), borrowing=(0, 0))
    return config, [("submit", 0, 3, 0, 0, 60, 0, 3), ("advance", 30), ("backup",), ("advance", 60), ("advance", 30),
                    ("restore",), ("advance", 60), ("advance", 60), ("advance", 60)]


def cancel_before_any_start() -> tuple[WorldConfig, list[tuple]]:
    """Two clusters; the cheaper one refuses the control plane's credential (401) for its first calls, and a job
    placed there is cancelled before its objects could be created: the cancel finishes once the cluster
    answers, a few seconds after it was asked. Nothing started, so nothing is billed past the cancel."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 4, "2.29"),
                          ClusterConfig("c1", "gcp", "on-demand", 1, 8, "1.94")), nominal=(5, 4), borrowing=(5, 4))
    return config, [("credential_rejected", 1, 4), ("submit", 0, 0, 1, 1, 20, 1, 1)]


def array_element_cancelled_unreachable() -> tuple[WorldConfig, list[tuple]]:
    """A sweep of 3 one-GPU elements, 2 at once, both on the cheaper cluster, whose API server then stops
    answering for 30 s; one element is cancelled meanwhile (it ends at once, its deletion pending): the third
    element must wait until a look finds the cancelled element's pods gone, not start beside them."""
    config = WorldConfig((ClusterConfig("c0", "aws", "on-demand", 1, 4, "1.45"),
                          ClusterConfig("c1", "aws", "on-demand", 2, 4, "1.05")), nominal=(6, 6), borrowing=(12, 3))
    return config, [("submit", 0, 0, 0, 1, 20, 2, 3), ("cluster_outage", 1, 30), ("advance", 10), ("cancel", 1),
                    ("advance", 30), ("advance", 60)]


#: name -> (scenario function, the invariants its failure broke).
REGRESSIONS = {
    "admit_preempt_loop": (admit_preempt_loop, ("bounded_preemption_before_run",)),
    "unreadable_credential": (unreadable_credential, ("no_task_crash", "api_always_answers")),
    "control_plane_outage": (control_plane_outage, ("lost_on_watched_time", "no_healthy_pod_deleted")),
    "spot_reclaim_return": (spot_reclaim_return, ("recovery_avoids_reclaimed",)),
    "replicas_share_nodes": (replicas_share_nodes, ("accepted_is_placeable", "liveness")),
    "billed_past_the_end": (billed_past_the_end, ("billed_once",)),
    "preempted_pods_still_stopping": (preempted_pods_still_stopping, ("no_duplicate_run",)),
    "restore_from_backup": (restore_from_backup, ("no_healthy_pod_deleted", "no_duplicate_run", "billed_once")),
    "end_record_behind_the_stop": (end_record_behind_the_stop, ("billed_once",)),
    "waiting_at_backup_started_in_the_gap": (waiting_at_backup_started_in_the_gap, ("liveness", "nothing_left_behind")),
    "array_across_a_restore": (array_across_a_restore, ("array_element_once",)),
    "cancel_before_any_start": (cancel_before_any_start, ("billed_past_end_explained",)),
    "array_element_cancelled_unreachable": (array_element_cancelled_unreachable,
                                            ("array_within_parallelism", "array_completes")),
}
