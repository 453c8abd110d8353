"""The ledger check's metrics side counts every pod that holds GPUs: bound to a node, not finished, whatever it is
doing there (Running, or Pending while it pulls its image or runs its init containers).

Class of failure: GPUs held but not counted (a pod stuck in image pull holds its GPUs, the ledger rightly bills
them, and a check that counted Running pods only flagged a 100 % difference). Invariant: kube-state-metrics'
allocated GPU-hours are, per pod, its GPU requests times the scrapes at which it was bound and Pending or
Running; a pod missing from the ledger is still flagged.

A real Prometheus (promtool-built) holds kube-state-metrics series as kube-state-metrics writes them: the 0/1
``kube_pod_status_phase`` series of every phase, ``kube_pod_info`` (``node`` from binding on) and
``kube_pod_container_resource_requests`` (``node`` from binding on as well). Expected values are worked out here
from each pod's timeline, scrape by scrape.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest

from costs import prometheus
from costs.ledger import accrue_attempt
from costs.ledgercheck import check_ledger
from jobs.models import JobState
from runners.models import Cluster
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.prometheus import start_prometheus

STEP = 60
T0 = dt.datetime(2026, 4, 14, 8, tzinfo=UTC)
START, END = T0, T0 + dt.timedelta(hours=3)
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
M = dt.timedelta(minutes=1)

# (cluster, namespace, pod, GPUs, [(minutes from T0, state)]): each state holds from its minute to the next one;
# ``unbound`` is Pending before binding, ``pending`` Pending on its node (image pull, init containers), ``gone``
# the pod deleted (no more series).
PODS = [
    ("pull", "cp-alpha", "job-1-1-0-pull", 8, [(0, "pending"), (60, "gone")]),  # ImagePullBackOff for an hour
    ("pull", "cp-alpha", "job-2-1-0-init", 2, [(0, "unbound"), (3, "pending"), (13, "running"), (43, "succeeded"),
                                               (100, "gone")]),
    ("pull", "cp-alpha", "job-3-1-0-wait", 4, [(0, "unbound"), (30, "gone")]),  # never bound: holds nothing
    ("pull", "cp-beta", "job-4-1-0-oops", 1, [(10, "pending"), (20, "failed"), (80, "gone")]),
    ("rogue", "cp-alpha", "job-5-1-0-pull", 8, [(0, "pending"), (60, "gone")]),  # billed, as on ``pull``
    ("rogue", "default", "someone-else", 8, [(0, "pending"), (20, "running"), (60, "gone")]),  # never billed
    # Pods on part of one GPU ask one device of the resource the node's sharing mode advertises (NVIDIA device
    # plugin: a time-sliced GPU renamed ``nvidia.com/gpu.shared``, a MIG device of the mixed strategy
    # ``nvidia.com/mig-<profile>``); kube-state-metrics names the resource with dots and dashes as underscores.
    ("shared", "cp-alpha", "job-6-1-0-slice", 1, [(0, "running"), (90, "gone")]),
    ("shared", "cp-alpha", "job-7-1-0-mig", 1, [(30, "running"), (150, "gone")]),
    ("shared", "cp-alpha", "job-8-1-0-whole", 2, [(0, "running"), (60, "gone")]),
]

#: The GPU resource each pod requests (``nvidia_com_gpu`` when not named); every pod also requests CPU, which is
#: never counted as GPUs.
RESOURCE = {"job-6-1-0-slice": "nvidia_com_gpu_shared", "job-7-1-0-mig": "nvidia_com_mig_1g_10gb"}


def scrapes() -> list[float]:
    """Every kube-state-metrics scrape time: each minute at second 45, from 5 minutes before T0 to past END."""
    first = int(T0.timestamp()) - 5 * STEP + 45
    return [float(t) for t in range(first, int(END.timestamp()) + 5 * STEP, STEP)]


def state_at(timeline, t: float) -> str:
    state = "gone"
    for minute, name in timeline:
        if t >= (T0 + minute * M).timestamp():
            state = name
    return state


def openmetrics() -> str:
    families: dict[str, list[str]] = {"kube_pod_status_phase": [], "kube_pod_info": [],
                                      "kube_pod_container_resource_requests": []}
    for cluster, ns, pod, gpus, timeline in PODS:
        uid = f"uid-{pod}"
        for t in scrapes():
            state = state_at(timeline, t)
            if state == "gone" and t < (T0 + timeline[0][0] * M).timestamp():
                continue  # not created yet
            if state == "gone":
                continue
            phase = {"unbound": "Pending", "pending": "Pending", "running": "Running", "succeeded": "Succeeded",
                     "failed": "Failed"}[state]
            node = "" if state == "unbound" else f',node="{cluster}-gpu-0"'
            base = f'cluster="{cluster}",namespace="{ns}",pod="{pod}",uid="{uid}"'
            for name in PHASES:
                families["kube_pod_status_phase"].append(
                    f'kube_pod_status_phase{{{base},phase="{name}"}} {int(name == phase)} {t:.0f}')
            families["kube_pod_info"].append(f'kube_pod_info{{{base}{node},created_by_kind="Job"}} 1 {t:.0f}')
            resource = RESOURCE.get(pod, "nvidia_com_gpu")
            families["kube_pod_container_resource_requests"] += [
                f'kube_pod_container_resource_requests{{{base}{node},container="main",resource="{resource}",'
                f'unit="integer"}} {gpus} {t:.0f}',
                f'kube_pod_container_resource_requests{{{base}{node},container="main",resource="cpu",'
                f'unit="core"}} 4 {t:.0f}']
    lines = []
    for name, rows in families.items():
        lines += [f"# TYPE {name} gauge", *rows]
    return "\n".join([*lines, "# EOF"]) + "\n"


def held_gpu_hours(pod: str, start: dt.datetime = START, end: dt.datetime = END) -> float:
    """GPU-hours ``pod`` held in ``[start, end)``: its GPUs for each scrape at which it was bound and not finished."""
    (_, _, _, gpus, timeline), = [p for p in PODS if p[2] == pod]
    held = [t for t in scrapes() if start.timestamp() <= t < end.timestamp()
            and state_at(timeline, t) in ("pending", "running")]
    return gpus * len(held) * STEP / 3600


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory):
    proc, url = start_prometheus(tmp_path_factory.mktemp("ksm-prometheus"), openmetrics())
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.parametrize("cluster", ["pull", "rogue", "shared"])
def test_allocated_gpu_hours_count_every_bound_unfinished_pod_scrape_by_scrape(prometheus_url, cluster):
    source = prometheus.Source(prometheus_url, f',cluster="{cluster}"')
    got = prometheus.allocated_gpu_hours_by(source, START, END, ("pod",), step_seconds=STEP)
    want = {(pod,): held_gpu_hours(pod) for c, _, pod, _, _ in PODS if c == cluster and held_gpu_hours(pod)}
    assert got == pytest.approx(want)
    assert ("job-3-1-0-wait",) not in got  # never bound: no GPU held, no group


def test_a_pod_in_image_pull_billed_for_its_hour_is_no_discrepancy_and_a_pod_missing_from_the_ledger_is(
        prometheus_url, settings, catalog, teams, user):
    """``pull``'s ledger bills what its attempts held (the image-pull pod's hour, the init pod from its binding to
    its end, the failed pod's ten minutes): the check agrees. ``rogue``'s ledger bills its image-pull attempt but
    not the pod someone ran beside the platform: flagged."""
    settings.COSTS_PROMETHEUS_URL = prometheus_url
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = STEP
    billed = {"job-1-1-0-pull": (0, 60), "job-2-1-0-init": (3, 43), "job-4-1-0-oops": (10, 20),
              "job-5-1-0-pull": (0, 60)}
    clusters = {}
    for name in ("pull", "rogue"):
        clusters[name], pool = make_cluster(name, "aws", "us-east-1", catalog["H100-80GB"])
        Cluster.objects.filter(pk=clusters[name].pk).update(last_contact_at=END)
        for c, _, pod, gpus, _ in PODS:
            if c == name and pod in billed:
                job = make_job_row(teams[0], user, catalog["H100-80GB"], name=pod[:20], spec={}, gpus_per_node=gpus,
                                   state=JobState.SUCCEEDED)
                lo, hi = billed[pod]
                attempt = make_attempt(job, clusters[name], pool, gpus=gpus, started_at=T0 + lo * M,
                                       ended_at=T0 + hi * M, state=JobState.SUCCEEDED)
                accrue_attempt(attempt.pk)

    calm = check_ledger(clusters["pull"], START, END)
    assert not calm.flagged, (calm.ledger_gpu_hours, calm.metrics_gpu_hours)
    assert calm.ledger_gpu_hours == pytest.approx(8 * 1 + 2 * 40 / 60 + 1 * 10 / 60)
    assert calm.metrics_gpu_hours == pytest.approx(sum(held_gpu_hours(p) for p in
                                                       ("job-1-1-0-pull", "job-2-1-0-init", "job-4-1-0-oops")))

    flagged = check_ledger(clusters["rogue"], START, END)
    assert flagged.flagged
    assert flagged.ledger_gpu_hours == pytest.approx(8.0)
    assert flagged.metrics_gpu_hours == pytest.approx(held_gpu_hours("job-5-1-0-pull") + held_gpu_hours("someone-else"))


def test_pods_on_shared_gpus_count_their_device_on_both_sides_of_the_check(prometheus_url, settings, catalog, teams,
                                                                             user):
    """A quarter of a time-sliced GPU, a MIG 1g.10gb device and two whole GPUs, each billed for exactly the time
    its pod held them: the ledger bills the shares (0.25, 1/8), but kube-state-metrics counts each pod's one
    device, so the check compares devices on both sides and is calm; its metrics side counts the renamed
    time-slicing and MIG resources and never the CPU requests."""
    settings.COSTS_PROMETHEUS_URL = prometheus_url
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = STEP
    cluster, pool = make_cluster("shared", "aws", "us-east-1", catalog["H100-80GB"])
    Cluster.objects.filter(pk=cluster.pk).update(last_contact_at=END)
    held = {"job-6-1-0-slice": (250, 0, 90), "job-7-1-0-mig": (125, 30, 150), "job-8-1-0-whole": (0, 0, 60)}
    for pod, (share, lo, hi) in held.items():
        gpus = 2 if not share else 1
        job = make_job_row(teams[0], user, catalog["H100-80GB"], name=pod[:20], spec={}, gpus_per_node=gpus,
                           max_runtime=86400, state=JobState.SUCCEEDED, gpu_share_milli=share)
        attempt = make_attempt(job, cluster, pool, gpus=gpus, started_at=T0 + lo * M, ended_at=T0 + hi * M,
                               state=JobState.SUCCEEDED)
        accrue_attempt(attempt.pk)

    check = check_ledger(cluster, START, END)
    assert check.ledger_gpu_hours == pytest.approx(1 * 90 / 60 + 1 * 120 / 60 + 2 * 1)
    assert check.metrics_gpu_hours == pytest.approx(sum(held_gpu_hours(p) for p in held))
    assert not check.flagged, (check.ledger_gpu_hours, check.metrics_gpu_hours)
