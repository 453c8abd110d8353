"""Shared GPUs on the local runner's emulated cluster (ADR 0040): a time-sliced node and a MIG node beside the
whole-GPU nodes, described as GPU feature discovery describes a Kubernetes node, placed on unchanged, each process
told what it holds, and reported by the exporter per physical GPU and per MIG device (``GPU_I_ID``)."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from core.gpus import MILLI_PER_GPU
from jobs.models import JobAttempt
from jobs.scheduling.offers import book_share
from jobs.scheduling.passes import try_admit
from runners.kubernetes.nodepools import gpu_inventory
from runners.local.exporter import LocalGpuCollector, emulated_gpus, render
from runners.local.runner import LocalBackend
from runners.local.sharing import SharedNode, SharedNodesError, parse_shared_nodes, place_share
from runners.models import Node
from tests.support.factories import make_job_row
from tests.support.local_runner import dispatched, emulated_local_cluster_for, wait_until

pytestmark = pytest.mark.django_db
SHARED = "time-slicing:1x4;mig-mixed:1x1g.10gb=2,3g.40gb=1"
HOST = "test-host"
#: Prints the variables that say what the process holds, then stays busy on the CPU for a while (its "GPU" work).
SHOW_AND_SPIN = ("import json, os, time\n"
                 "print('HOLDS', json.dumps({k: v for k, v in os.environ.items() "
                 "if k.startswith(('CONTROLPLANE_GPU', 'CONTROLPLANE_MIG')) or k == 'CUDA_VISIBLE_DEVICES'}), flush=True)\n"
                 "end = time.time() + {seconds}\n"
                 "while time.time() < end:\n    pass\n")


@pytest.fixture
def shared_cluster(local_runs, settings, monkeypatch, catalog, teams):
    """The emulated local cluster of 2 whole nodes x 4 H100s with ``SHARED``'s two shared nodes, alpha's quota."""
    settings.LOCAL_RUNNER_SHARED_NODES = SHARED
    return emulated_local_cluster_for(settings, monkeypatch, teams[0], catalog["H100-80GB"], nodes=2)


def allocatable(node: Node) -> dict:
    """What the device plugin would advertise on a node of this shape: slices (GPUs x replicas) of a time-sliced
    node; the GPUs without MIG and each profile's devices of a MIG mixed one."""
    if node.gpu_sharing == "time-slicing":
        return {"nvidia.com/gpu": str(node.gpus * node.gpu_replicas)}
    if node.gpu_sharing == "mig-mixed":
        return {"nvidia.com/gpu": str(node.whole_gpus or 0),
                **{f"nvidia.com/mig-{p}": str(n) for p, n in node.mig_devices.items()}}
    return {"nvidia.com/gpu": str(node.gpus)}


def test_the_shared_nodes_are_described_as_gpu_feature_discovery_would(shared_cluster):
    nodes = {n.name: n for n in Node.objects.filter(cluster=shared_cluster)}

    ts, mig = nodes["local-time-slicing-0"], nodes["local-mig-mixed-0"]
    assert (ts.gpus, ts.gpu_sharing, ts.gpu_replicas, ts.slice_resource, ts.whole_gpus) == (
        1, "time-slicing", 4, "nvidia.com/gpu", 0)
    assert ts.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-SHARED"
    assert (mig.gpus, mig.gpu_sharing, mig.mig_devices, mig.whole_gpus) == (
        1, "mig-mixed", {"1g.10gb": 2, "3g.40gb": 1}, 0)
    # The Kubernetes inventory rule reads the same shape from the same labels.
    for node in (ts, mig):
        shape = gpu_inventory(node.labels, allocatable(node))
        assert (shape["gpus"], shape["sharing"], shape["gpu_replicas"], dict(shape["mig_devices"]),
                shape["whole_gpus"]) == (node.gpus, node.gpu_sharing, node.gpu_replicas, node.mig_devices,
                                         node.whole_gpus)
    # The whole-GPU nodes and the pool's shape are as without shared nodes.
    assert {n: (nodes[n].gpus, nodes[n].gpu_sharing) for n in ("local-node-0", "local-node-1")} == {
        "local-node-0": (4, "none"), "local-node-1": (4, "none")}
    pool = shared_cluster.node_pools.get(name="gpu")
    assert (pool.nodes, pool.gpus_per_node) == (2, 4)


@pytest.mark.parametrize("text,why", [
    ("time-slicing:1x1", "replicas must be at least 2"),
    ("mig-mixed:1x1g.5gb=2", "not a MIG profile of H100-80GB"),
    ("mig-mixed:1x3g.40gb=2,1g.10gb=1", "7 compute"),
    ("shared:1x4", "the mode must be one of"),
    ("time-slicing:4", "expected <gpus>x"),
])
def test_a_configuration_that_cannot_be_read_names_the_entry_and_why(text, why):
    with pytest.raises(SharedNodesError, match=why):
        parse_shared_nodes(text, "H100-80GB")


def submit(teams, user, catalog, seconds: float, *, share: int = 0, profile: str = "", name: str = "j") -> JobAttempt:
    """A job running ``SHOW_AND_SPIN`` on part of a GPU (``share`` milli-GPUs, a MIG ``profile``) or one whole GPU,
    admitted and dispatched; its attempt."""
    spec = {"command": [sys.executable, "-c", SHOW_AND_SPIN.replace("{seconds}", str(seconds))], "env": {}}
    job = make_job_row(teams[0], user, catalog["H100-80GB"], name=name, spec=spec, gpus_per_node=1, nodes=1,
                       gpu_share_milli=share, mig_profile=profile)
    assert try_admit(job.pk) == "admitted"
    job.refresh_from_db()
    return dispatched(JobAttempt.objects.select_related("job__team", "cluster", "node_pool")
                      .get(pk=job.current_attempt_id))


def holds(attempt: JobAttempt) -> dict:
    """The variables the attempt's process printed (``HOLDS {...}``), once it has."""
    line = wait_until(lambda: next((row for row in LocalBackend().logs(attempt).splitlines()
                                    if row.startswith("HOLDS ")), None), what=f"{attempt} to start")
    return json.loads(line.removeprefix("HOLDS "))


def test_fractional_mig_and_whole_jobs_run_side_by_side_each_told_what_it_holds(shared_cluster, teams, user,
                                                                              catalog):
    quarter = submit(teams, user, catalog, 4, share=250, name="quarter")
    half = submit(teams, user, catalog, 4, share=500, name="half")
    mig = submit(teams, user, catalog, 4, share=125, profile="1g.10gb", name="mig")
    whole = submit(teams, user, catalog, 4, name="whole")

    assert quarter.placement["nodes"] == half.placement["nodes"] == ["local-time-slicing-0"]
    assert mig.placement["nodes"] == ["local-mig-mixed-0"]
    assert whole.placement["nodes"][0] in ("local-node-0", "local-node-1")
    assert holds(quarter) == {"CONTROLPLANE_GPU_SHARING": "time-slicing", "CONTROLPLANE_GPU_SHARE": "0.25",
                              "CONTROLPLANE_GPU_SHARE_MILLI": "250", "CONTROLPLANE_GPU_NODE": "local-time-slicing-0",
                              "CONTROLPLANE_GPU_INDEX": "0", "CUDA_VISIBLE_DEVICES": ""}
    assert holds(half)["CONTROLPLANE_GPU_SHARE"] == "0.5"
    assert holds(mig) == {"CONTROLPLANE_GPU_SHARING": "mig-mixed", "CONTROLPLANE_GPU_SHARE": "0.125",
                          "CONTROLPLANE_GPU_SHARE_MILLI": "125", "CONTROLPLANE_GPU_NODE": "local-mig-mixed-0",
                          "CONTROLPLANE_GPU_INDEX": "0", "CONTROLPLANE_MIG_PROFILE": "1g.10gb",
                          "CONTROLPLANE_MIG_INSTANCE": "1", "CUDA_VISIBLE_DEVICES": ""}
    assert not any(k.startswith("CONTROLPLANE_GPU_S") for k in holds(whole))
    # A second 1g.10gb job gets the other device of that profile.
    second = submit(teams, user, catalog, 4, share=125, profile="1g.10gb", name="mig2")
    assert holds(second)["CONTROLPLANE_MIG_INSTANCE"] == "2"

    # The exporter: 8 whole GPUs (0-7), the time-sliced GPU (8) with a series per pod on it, each with the GPU's
    # value; the MIG GPU (9) with one series per device, GPU_I_ID and GPU_I_PROFILE, its holder's pod labels.
    text = render(LocalGpuCollector(hostname=HOST, gpus=lambda: emulated_gpus(HOST)))
    util = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "DCGM_FI_DEV_GPU_UTIL"]
    on = {}
    for s in util:
        on.setdefault(s.labels["gpu"], []).append(s)
    assert sorted(on, key=int) == [str(i) for i in range(10)]
    sliced = on["8"]
    assert {s.labels["pod"] for s in sliced} == {f"{quarter.object_name}-0", f"{half.object_name}-0"}
    assert len({s.value for s in sliced}) == 1 and all(s.labels["Hostname"] == "local-time-slicing-0" for s in sliced)
    devices = {(s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"]): s.labels.get("pod") for s in on["9"]}
    assert devices == {("1", "1g.10gb"): f"{mig.object_name}-0", ("2", "1g.10gb"): f"{second.object_name}-0",
                       ("3", "3g.40gb"): None}
    requests = {s.labels["pod"]: s.labels["resource"] for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "kube_pod_container_resource_requests"}
    assert requests[f"{mig.object_name}-0"] == "nvidia_com_mig_1g_10gb"
    assert requests[f"{quarter.object_name}-0"] == "nvidia_com_gpu"


@given(gpus=st.integers(1, 3), replicas=st.integers(2, 5),
       asks=st.lists(st.integers(1, 60).map(lambda x: x * 10), min_size=1, max_size=12))
def test_a_share_is_laid_on_the_gpu_admission_books_it_on(gpus, replicas, asks):
    """The runner's pick of a time-sliced GPU for each new share is the one admission's model books it on
    (``jobs.scheduling.offers.book_share``, fed the same shares in the same order), so the device a process is told
    it holds is the one the platform counts; a share that fits nowhere is refused, never squeezed in."""
    node = SharedNode("local-time-slicing-0", "time-slicing", gpus, replicas)
    room = {"shares": [MILLI_PER_GPU] * gpus, "slices": [replicas] * gpus, "mig": {}}
    taken = []
    for milli in asks:
        fits = any(room["shares"][k] >= milli and room["slices"][k] > 0 for k in range(gpus))
        share = place_share(node, milli, "", taken)
        if not fits:
            assert share is None
            continue
        before = list(room["shares"])
        book_share(room, milli, "")
        booked = next(k for k in range(gpus) if room["shares"][k] != before[k])
        assert share is not None and share.gpu == booked
        taken.append(share)
