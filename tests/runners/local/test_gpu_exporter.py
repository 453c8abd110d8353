"""The local runner's exporter: dcgm-exporter and kube-state-metrics series for live local attempts, utilization of
emulated GPUs from the CPU usage of the attempt's real processes, and a real Prometheus scraping it."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
import time

import pytest
import requests
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.namespaces import team_namespace
from costs.prometheus import Source, attempt_pod_matchers, read_usage
from jobs.models import JobState
from runners.local.exporter import (
    Exporter,
    LocalGpuCollector,
    emulated_gpus,
    prometheus_config,
    render,
)
from runners.local.procs import ref_of
from tests.support.factories import make_attempt, make_job_row
from tests.support.net import free_port

BUSY_LOOP = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


def busy_argv(seconds: float) -> list[str]:
    """A command that keeps one CPU busy for ``seconds``."""
    return [sys.executable, "-c", BUSY_LOOP.format(seconds=seconds)]


HOST = "test-host"


@pytest.fixture
def fake_attempt(emulated_local_cluster, teams, user, settings):
    """``make(argv, gpus)``: a RUNNING job with a started attempt whose node 0 is ``argv`` run as a process group leader
    (as the launcher's supervisor is), recorded in the attempt directory as the runner records it."""
    cluster, pool = emulated_local_cluster
    procs = []

    def make(argv, gpus=2):
        job = make_job_row(teams[0], user, pool.accelerator, name="j", state=JobState.RUNNING, gpus_per_node=gpus)
        attempt = make_attempt(job, cluster, pool, gpus=gpus, usd_per_gpu_hour="2.00")
        directory = settings.LOCAL_RUNNER_DIR / attempt.object_name
        directory.mkdir(parents=True)
        (directory / "attempt.json").write_text(json.dumps(
            {"attempt_id": attempt.pk, "job_id": job.pk, "number": 1, "object_name": attempt.object_name,
             "cluster_id": cluster.pk, "nodes": 1, "devices": None}))
        proc = subprocess.Popen(argv, start_new_session=True)
        procs.append(proc)
        ref = ref_of(proc.pid).to_json()
        (directory / "node-0.pid").write_text(json.dumps({"supervisor": ref, "child": ref}))
        return attempt, proc

    yield make
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def samples(text: str, name: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def emulated_collector() -> LocalGpuCollector:
    """The exporter's collector on the emulated GPUs (whatever GPUs this machine has)."""
    return LocalGpuCollector(hostname=HOST, gpus=lambda: emulated_gpus(HOST))


def by_pod(text: str, name: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for s in samples(text, name):
        found.setdefault(s.labels.get("pod"), []).append(s)
    return found


@pytest.mark.django_db
def test_busy_and_idle_attempts(fake_attempt, teams):
    busy, busy_proc = fake_attempt(busy_argv(3), gpus=2)
    idle, _ = fake_attempt(["sleep", "30"], gpus=2)
    collector = emulated_collector()
    time.sleep(1.0)

    text = render(collector)

    namespace = team_namespace(teams[0].slug)
    util = by_pod(text, "DCGM_FI_DEV_GPU_UTIL")
    busy_pod, idle_pod = f"{busy.object_name}-0", f"{idle.object_name}-0"
    assert len(util[busy_pod]) == 2 and len(util[idle_pod]) == 2  # one series per GPU of the node
    for s in util[busy_pod] + util[idle_pod]:
        assert s.labels["namespace"] == namespace and s.labels["container"] == "main"
        assert {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(s.labels)
        assert s.labels["Hostname"] == HOST
    assert all(0 < s.value <= 100 for s in util[busy_pod]), util[busy_pod]
    assert all(s.value < 5 for s in util[idle_pod]), util[idle_pod]
    # The GPUs no attempt uses have no pod labels at all; every GPU appears once.
    assert len(util[None]) == 4 and all(s.value == 0 for s in util[None])
    assert sorted(int(s.labels["gpu"]) for group in util.values() for s in group) == list(range(8))
    assert all(s.value > 0 for s in by_pod(text, "DCGM_FI_DEV_FB_USED")[busy_pod])  # resident memory, emulated

    # costs.collection maps these series to the attempt: the team's namespace, pods named "<object_name>-...".
    assert attempt_pod_matchers(teams[0].slug, busy.object_name) == f'namespace="{namespace}",pod=~"{busy.object_name}-.*"'
    requests_ = by_pod(text, "kube_pod_container_resource_requests")[busy_pod]
    assert [(s.labels["resource"], s.labels["unit"], s.value) for s in requests_] == [("nvidia_com_gpu", "integer", 2)]
    phases = {s.labels["phase"]: s.value for s in by_pod(text, "kube_pod_status_phase")[busy_pod]}
    assert phases["Running"] == 1

    # A second scrape measures the rate since the first: still busy while the loop runs, idle stays ~0.
    time.sleep(0.5)
    second = by_pod(render(collector), "DCGM_FI_DEV_GPU_UTIL")
    if busy_proc.poll() is None:
        assert all(s.value > 0 for s in second[busy_pod])
    assert all(s.value < 5 for s in second[idle_pod])


@pytest.mark.django_db
def test_ended_attempts_have_no_pod_series(fake_attempt):
    attempt, _ = fake_attempt(["sleep", "30"], gpus=1)
    attempt.ended_at = timezone.now()
    attempt.save(update_fields=["ended_at"])

    text = render(emulated_collector())

    assert not samples(text, "kube_pod_status_phase")
    assert all("pod" not in s.labels for s in samples(text, "DCGM_FI_DEV_GPU_UTIL"))


@pytest.mark.django_db
def test_a_cpu_only_attempt_has_no_gpu_series(fake_attempt):
    attempt, _ = fake_attempt(["sleep", "30"], gpus=0)  # a CPU-only job holds no GPU: nothing to attribute

    text = render(emulated_collector())

    assert not samples(text, "kube_pod_status_phase")
    assert all("pod" not in s.labels for s in samples(text, "DCGM_FI_DEV_GPU_UTIL"))


@pytest.mark.django_db(transaction=True)
def test_real_prometheus_scrapes_the_exporter(fake_attempt, teams, tmp_path):
    attempt, _ = fake_attempt(busy_argv(60), gpus=1)
    started = timezone.now()
    exporter = Exporter(port=0, addr="127.0.0.1", collector=emulated_collector()).start()
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(f"127.0.0.1:{exporter.port}", interval=1))
    port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        prometheus = subprocess.Popen(
            [shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    pod = f"{attempt.object_name}-0"
    namespace = team_namespace(teams[0].slug)
    try:
        deadline = time.monotonic() + 60
        result = []
        while time.monotonic() < deadline:
            try:
                answer = requests.get(f"{url}/api/v1/query", timeout=2, params={
                    "query": f'count_over_time(DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}",pod="{pod}"}}[1m])'}).json()
                result = answer["data"]["result"]
                if result and float(result[0]["value"][1]) >= 3:
                    break
            except (requests.ConnectionError, KeyError):
                pass
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.5)
        assert result and float(result[0]["value"][1]) >= 3, result
        assert result[0]["metric"]["container"] == "main"

        # The platform's own reader maps the series to the attempt and finds it busy.
        usage = read_usage(Source(url, ""), attempt_pod_matchers(teams[0].slug, attempt.object_name),
                           started - dt.timedelta(seconds=5), timezone.now(), step_seconds=1)
        assert usage.samples >= 3 and usage.avg_util_percent > 0
        phase = requests.get(f"{url}/api/v1/query", timeout=2,
                             params={"query": f'kube_pod_status_phase{{phase="Running",pod="{pod}"}}'}).json()
        assert float(phase["data"]["result"][0]["value"][1]) == 1
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        exporter.stop()
