"""A real Prometheus (Debian package ``prometheus``) over the synthetic fleet, and that fleet in the database.

Two servers start once per session: a shared one holding aws-east and
gcp-central under a ``cluster`` label (the global Thanos-like case), and
oci-ash's own one without that label. Their TSDBs are built with
``promtool tsdb create-blocks-from openmetrics``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import subprocess
import time
import urllib.request

import pytest
from django.db import transaction

from costs.collection import collect_utilization
from costs.ledger import accrue_attempt
from costs.models import Price
from costs.seed import seed_accelerators, seed_prices
from jobs.models import JobState
from quotas.models import Team
from runners.models import Accelerator, Cluster, NodePool

from . import synthetic_fleet as F
from .factories import make_attempt, make_job_row
from .net import free_port
from .personas import make_persona


def start_prometheus(workdir, text: str) -> tuple[subprocess.Popen, str]:
    """A Prometheus serving the OpenMetrics ``text`` as its TSDB (built by ``promtool``) from ``workdir``;
    returns the process and its URL once it is ready. Raises RuntimeError (with its log) if it does not start."""
    workdir.mkdir(parents=True, exist_ok=True)
    source, data = workdir / "fleet.om", workdir / "data"
    source.write_text(text)
    subprocess.run([shutil.which("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                   check=True, capture_output=True)
    source.unlink()
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    port = free_port()
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [shutil.which("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if urllib.request.urlopen(url + "/-/ready", timeout=1).status == 200:
                return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def serving(workdir, text: str):
    """``start_prometheus(workdir, text)`` as a context: its URL, the server stopped on leaving."""
    proc, url = start_prometheus(workdir, text)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def synthetic_fleet() -> F.Fleet:
    """The generated three-cluster fleet (``synthetic_fleet.generate``): the ground truth of the costs tests."""
    return F.generate()


@pytest.fixture(scope="session")
def prometheus_urls(synthetic_fleet, tmp_path_factory) -> dict[str, str]:
    """``{"global": url, "oci-ash": url}``: the two servers, started once and stopped at the end of the session."""
    root = tmp_path_factory.mktemp("prometheus")
    procs = []
    try:
        shared, shared_url = start_prometheus(root / "global",
                                              F.openmetrics(synthetic_fleet, ["aws-east", "gcp-central"], True))
        procs.append(shared)
        own, own_url = start_prometheus(root / "oci", F.openmetrics(synthetic_fleet, ["oci-ash"], False))
        procs.append(own)
        yield {"global": shared_url, "oci-ash": own_url}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def build_fleet(fleet: F.Fleet, urls: dict[str, str]) -> dict:
    """Clusters, node pools, prices, teams and one attempt per generated job, with the ledger accrued at midnights."""
    seed_accelerators()
    seed_prices()
    accelerators = {a.name: a for a in Accelerator.objects.all()}
    teams = {slug: Team.objects.create(slug=slug, name=slug.title()) for slug in F.TEAMS}
    clusters, pools = {}, {}
    for spec in F.CLUSTERS:
        cluster = Cluster.objects.create(name=spec.name, provider=spec.provider, region=spec.region,
                                         backend="kubernetes", prometheus_url=urls.get(spec.name, ""))
        clusters[spec.name] = cluster
        pools[spec.name] = NodePool.objects.create(cluster=cluster, name="gpu", accelerator=accelerators[spec.accelerator],
                                                   capacity_type=spec.capacity_type, nodes=spec.nodes, gpus_per_node=8)
        for effective_from, price in spec.prices:
            Price.objects.create(provider=spec.provider, region=spec.region, accelerator=accelerators[spec.accelerator],
                                 capacity_type=spec.capacity_type, cluster=cluster, usd_per_gpu_hour=price,
                                 effective_from=effective_from)
    staff = make_persona("finance", staff=True)
    midnights = [F.T0 + dt.timedelta(days=d) for d in range(1, F.DAYS + 1)]
    attempts = {}
    for job in fleet.jobs:
        pool = pools[job.cluster]
        row = make_job_row(teams[job.team], staff.user, pool.accelerator, name=job.object_name, spec={},
                           gpus_per_node=job.gpus, max_runtime=86400, state=JobState.SUCCEEDED)
        attempt = make_attempt(row, pool.cluster, pool, gpus=job.gpus, usd_per_gpu_hour=0, started_at=job.start,
                               ended_at=job.end, state=JobState.SUCCEEDED, object_name=job.object_name)
        for until in [m for m in midnights if job.start < m < job.end] + [job.end]:
            accrue_attempt(attempt.pk, until=until)  # periodic accrual, then the final one
        attempts[job.n] = attempt
    return {"teams": teams, "clusters": clusters, "attempts": attempts, "staff": staff}


@pytest.fixture(scope="module")
def fleet_db(django_db_setup, django_db_blocker, synthetic_fleet, prometheus_urls):
    """The fleet in the database with utilization collected, built once per module and rolled back after it.

    Each test runs in a savepoint inside this transaction (pytest-django's ``db``).
    """
    from django.test import override_settings

    with django_db_blocker.unblock(), override_settings(
        COSTS_PROMETHEUS_URL=prometheus_urls["global"], COSTS_SCRAPE_INTERVAL_SECONDS=F.STEP,
        COSTS_IDLE_UTIL_PERCENT=F.IDLE_PERCENT,
    ):
        with transaction.atomic():
            built = build_fleet(synthetic_fleet, prometheus_urls)
            collect_utilization(F.T0, F.END)
            yield built
            transaction.set_rollback(True)


def read_costs_from(settings, url: str, *, step: float, idle_percent: float, lookback: float) -> None:
    """Point the costs settings at the Prometheus at ``url``: its scrape interval ``step`` (seconds), the idle
    threshold ``idle_percent`` (percent) and its ``--query.lookback-delta`` ``lookback`` (seconds)."""
    settings.COSTS_PROMETHEUS_URL = url
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = step
    settings.COSTS_IDLE_UTIL_PERCENT = idle_percent
    settings.COSTS_QUERY_LOOKBACK_DELTA_SECONDS = lookback


@pytest.fixture
def costs_settings(settings, prometheus_urls):
    """The costs settings pointed at the shared Prometheus with the fleet's scrape interval and idle threshold."""
    settings.COSTS_PROMETHEUS_URL = prometheus_urls["global"]
    settings.COSTS_SCRAPE_INTERVAL_SECONDS = F.STEP
    settings.COSTS_IDLE_UTIL_PERCENT = F.IDLE_PERCENT
    return settings


@pytest.fixture(scope="session")
def dcgm_scenarios():
    """``{name: Scenario}`` of ``tests.support.dcgm_shapes``: the ground truth of the label-shape and gap tests."""
    from . import dcgm_shapes

    return {s.name: s for s in dcgm_shapes.scenarios()}


@pytest.fixture(scope="session")
def dcgm_prometheus(dcgm_scenarios, tmp_path_factory) -> str:
    """The URL of a Prometheus holding every DCGM scenario (one ``cluster`` label each); stopped after the session."""
    from . import dcgm_shapes

    proc, url = start_prometheus(tmp_path_factory.mktemp("dcgm"), dcgm_shapes.openmetrics(list(dcgm_scenarios.values())))
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
