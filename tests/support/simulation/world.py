"""The world one scenario runs on: the platform's database, emulated clusters, two teams in a cohort, the
simulated worker and beat, and the virtual clock.

``configure(database_url)`` sets the process's environment before Django starts (the in-memory broker, short
client timeouts, quiet logs); ``prepare_database()`` creates and migrates the database once per process;
``World(config)`` builds a scenario's rows and clusters (``reset`` empties every table first) and offers each
action a scenario can take. The platform's code does the work; the world only plays the users, the clusters'
owners and the clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import os
import random
import sys
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
#: Node labels of spot capacity, by provider (the labels the platform's node pool discovery reads).
SPOT_LABELS = {"aws": {"eks.amazonaws.com/capacityType": "SPOT"}, "gcp": {"cloud.google.com/gke-spot": "true"}}
REGIONS = {"aws": "us-east-1", "gcp": "us-central1"}


def configure(database_url: str, **overrides: str) -> None:
    """The environment of the control plane in this process (call before ``django.setup``): ``database_url``,
    Celery's in-memory broker, Django's in-memory mail outbox, client timeouts of 1 s (an injected timeout costs that much real time, while the
    emulators answer in milliseconds even on a loaded machine, so the load does not change a replay),
    no client-side rate limit, quiet logs; ``overrides`` win (setting name -> value)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    os.environ.update({
        "DATABASE_URL": database_url, "CELERY_BROKER_URL": "memory://", "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "K8S_CONNECT_TIMEOUT_SECONDS": "1.0", "K8S_READ_TIMEOUT_SECONDS": "1.0", "K8S_QPS": "100000",
        "K8S_BURST": "100000", "LOG_LEVEL": "CRITICAL", "LOOKUP_CACHE_SECONDS": "0", "CONN_MAX_AGE": "60",
        "K8S_IMAGE_PULL_GRACE_SECONDS": "120", "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
        **overrides,
    })


def prepare_database(recreate: bool = True) -> None:
    """Create (``recreate``: drop first) and migrate the database of ``DATABASE_URL``, then start Django."""
    import django

    url = os.environ["DATABASE_URL"]
    if recreate and url.startswith(("postgres://", "postgresql://")):
        import psycopg

        admin_url, dbname = url.rsplit("/", 1)
        with psycopg.connect((admin_url + "/postgres").replace("postgres://", "postgresql://"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{dbname}"')
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reset_database() -> None:
    """Empty every table of the platform (ids start at 1 again) and seed the accelerator and price catalog."""
    from django.apps import apps
    from django.db import connection

    from core.lookups import clear_all
    from costs.seed import seed_accelerators, seed_prices

    tables = [m._meta.db_table for m in apps.get_models(include_auto_created=True)
              if m._meta.app_label not in ("contenttypes", "sessions") and m._meta.managed]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE " + ", ".join(connection.ops.quote_name(t) for t in tables)
                           + " RESTART IDENTITY CASCADE")
        else:
            for table in tables:
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")
    clear_all()
    seed_accelerators()
    seed_prices()


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """One emulated cluster: its name, provider, ``capacity`` (``on-demand`` or ``spot``), ``nodes`` x
    ``gpus_per_node`` H100 GPUs, and its price override (USD per GPU-hour, a string)."""

    name: str
    provider: str
    capacity: str
    nodes: int
    gpus_per_node: int
    price: str


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """A scenario's fleet and teams: ``clusters``; team ``a`` and team ``b`` in one cohort with their nominal
    quotas and borrowing limits (GPUs)."""

    clusters: tuple[ClusterConfig, ...]
    nominal: tuple[int, int]
    borrowing: tuple[int, int]

    @classmethod
    def draw(cls, rng: random.Random) -> WorldConfig:
        """A random small fleet: 1-3 clusters of 1-2 nodes x 4 or 8 GPUs, on-demand or spot, $1.00-$3.00."""
        clusters = []
        for i in range(rng.randint(1, 3)):
            provider = rng.choice(["aws", "gcp"])
            clusters.append(ClusterConfig(f"c{i}", provider, rng.choice(["on-demand", "on-demand", "spot"]),
                                          rng.randint(1, 2), rng.choice([4, 8]), f"{rng.randint(100, 300) / 100:.2f}"))
        total = sum(c.nodes * c.gpus_per_node for c in clusters)
        nominal = (rng.randint(1, max(1, total // 2)), rng.randint(1, max(1, total // 2)))
        borrowing = (rng.randint(0, total), rng.randint(0, total))
        return cls(tuple(clusters), nominal, borrowing)


class World:
    """One scenario's world; see the module docstring. ``lifetimes`` maps a job id (as its pods' label) to the
    seconds its training pods run; ``submitted`` lists the job ids the API accepted, in order."""

    def __init__(self, config: WorldConfig, clock):
        from tests.support.kubernetes import ClusterEmulator

        from .worker import SimulatedWorker

        self.config, self.clock = config, clock
        self.lifetimes: dict[str, float] = {}
        self.submitted: list[int] = []
        self.arrays: dict[int, float] = {}  # job arrays the API accepted: id -> seconds each element's pods run
        # job id (its pods' label) -> (array id, index) as its pods' environment said, for pods that ran
        self.elements: dict[str, tuple[int, int]] = {}
        self.refused: list[tuple[int, dict]] = []
        self.emulators = {c.name: ClusterEmulator(c.name, lifetime=self._lifetime) for c in config.clusters}
        self.node_serial = 0
        self.worker = SimulatedWorker()
        self.down: set[str] = set()  # clusters whose API server is stopped
        self.control_plane_down_until: dt.datetime | None = None
        self.unreadable: dict[str, str] = {}  # cluster -> its stored credential, while unreadable
        self.api_errors: list[str] = []
        self.deletions_checked: dict[str, int] = {}
        self.reclaimed_nodes: set[str] = set()
        self.lowered: set[int] = set()  # teams whose quota was lowered during the scenario
        self.outages: list[tuple[dt.datetime, dt.datetime]] = []  # the control plane's own downtime
        self.cluster_back: dict[str, dt.datetime] = {}  # cluster -> when its API server answers again
        self.initial_quotas: dict[int, tuple[int, int]] = {}
        self.disturbed: set[str] = set()  # clusters that lost a node or their API server at some point
        self.backup: tuple[str, list[int]] | None = None  # the latest pg_dump and the jobs submitted by then
        self.after_restore_due = False  # a restore happened and ``manage.py after_restore`` has not yet passed
        self.restores = 0
        self.subscription = None  # team a's e-mail subscription to every job event (invariants.notified_once)

    def _lifetime(self, pod: dict) -> float | None:
        job = (pod["metadata"].get("labels") or {}).get("controlplane.io/job")
        if job in self.lifetimes:
            return self.lifetimes[job]
        env = {v.get("name"): v.get("value") for v in (pod["spec"]["containers"][0].get("env") or ())}
        if "CONTROLPLANE_ARRAY_ID" not in env:
            return None
        # An array's element: it runs its array's lifetime, and the pod's own word says which element it is.
        array = int(env["CONTROLPLANE_ARRAY_ID"])
        self.elements[job] = (array, int(env["CONTROLPLANE_ARRAY_INDEX"]))
        return self.arrays.get(array)

    # --- building ----------------------------------------------------------------------------------------------

    def build(self) -> None:
        """Rows, clusters, nodes and users of the scenario on an empty database; node pools come from the
        platform's own discovery (``sync_node_pools``)."""
        from django.contrib.auth import get_user_model
        from django.test import Client

        from costs.models import Price
        from quotas.models import Cohort, Membership, Quota, Team
        from runners.models import Accelerator, Cluster

        reset_database()
        self.worker.purge()
        h100 = Accelerator.objects.get(name="H100-80GB")
        cohort = Cohort.objects.create(name="lab")
        user = get_user_model().objects.create_user(username="sim", password="x")
        self.teams = []
        for slug, nominal, borrowing in zip("ab", self.config.nominal, self.config.borrowing, strict=True):
            team = Team.objects.create(slug=slug, name=slug, cohort=cohort)
            Quota.objects.create(team=team, accelerator=h100, nominal_gpus=nominal, borrowing_limit_gpus=borrowing)
            self.initial_quotas[team.pk] = (nominal, borrowing)
            Membership.objects.create(team=team, user=user, role=Membership.Role.MEMBER)
            self.teams.append(team)
        from notifications.models import JOB_EVENTS, Subscription

        self.subscription = Subscription.objects.create(team=self.teams[0], channel="email",
                                                        email="team-a@example.com", events=sorted(JOB_EVENTS))
        for c in self.config.clusters:
            emulator = self.emulators[c.name]
            emulator.start()
            for _ in range(c.nodes):
                self.add_node(c.name)
            cluster = Cluster.objects.create(name=c.name, provider=c.provider, region=REGIONS[c.provider],
                                             backend="kubernetes", api_endpoint=emulator.url, api_token=f"t-{c.name}")
            Price.objects.create(provider=c.provider, region=REGIONS[c.provider], accelerator=h100,
                                 capacity_type=c.capacity, cluster=cluster, usd_per_gpu_hour=Decimal(c.price),
                                 effective_from=self.clock.now() - dt.timedelta(days=1))
        from django.core.cache import cache

        cache.clear()  # a new world: no rate limit counted in an earlier one (user ids repeat across worlds)
        self.client = Client(raise_request_exception=False)
        self.client.force_login(user)
        self.worker.app.tasks["runners.tasks.sync_node_pools"].run()

    def stop(self) -> None:
        """Stop every emulated cluster's API server."""
        for emulator in self.emulators.values():
            emulator.stop()

    def cluster_config(self, name: str) -> ClusterConfig:
        return next(c for c in self.config.clusters if c.name == name)

    def add_node(self, cluster: str) -> str:
        """A new Ready node of ``cluster``'s shape (its spot labels on a spot cluster); returns its name."""
        c = self.cluster_config(cluster)
        self.node_serial += 1
        name = f"{cluster}-n{self.node_serial}"
        labels = {"nvidia.com/gpu.product": H100_LABEL, "nvidia.com/gpu.count": str(c.gpus_per_node)}
        if c.capacity == "spot":
            labels.update(SPOT_LABELS[c.provider])
        self.emulators[cluster].add_node(name, c.gpus_per_node, labels)
        return name

    # --- users ---------------------------------------------------------------------------------------------------

    def submit(self, team: int, nodes: int, gpus: int, kind: str, preemptible: bool, lifetime: float,
               max_retries: int, replicas: int = 1) -> int | None:
        """POST a job through the REST API as a member of team ``team`` (0: a, 1: b); returns its id, or None when
        refused (the answer is kept in ``refused``)."""
        spec = {"image": "registry.example/sim:1", "command": ["python", "work.py"],
                "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes},
                "max_runtime_seconds": 86400, "preemptible": preemptible, "max_retries": max_retries}
        if kind == "inference":
            spec.update(replicas=replicas, port=8000)
            spec["resources"]["nodes"] = 1
        body = {"team": self.teams[team].slug, "name": f"j{len(self.submitted) + len(self.refused)}", "kind": kind,
                "spec": spec}
        r = self.client.post("/api/v1/jobs/", body, content_type="application/json")
        if r.status_code == 201:
            job_id = r.json()["id"]
            self.submitted.append(job_id)
            if kind == "training":
                self.lifetimes[str(job_id)] = lifetime
            return job_id
        if r.status_code >= 500:
            self.api_errors.append(f"POST /api/v1/jobs/ answered {r.status_code}")
        self.refused.append((r.status_code, body))
        return None

    def submit_array(self, team: int, nodes: int, gpus: int, preemptible: bool, lifetime: float, max_retries: int,
                     *, count: int, parallelism: int) -> int | None:
        """POST a job array of ``count`` training elements, at most ``parallelism`` at once, through the REST API
        as a member of team ``team``; its elements' pods run ``lifetime`` seconds. Returns the array's id (None:
        refused, kept in ``refused``)."""
        spec = {"image": "registry.example/sim:1", "command": ["python", "work.py"],
                "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes},
                "max_runtime_seconds": 86400, "preemptible": preemptible, "max_retries": max_retries}
        body = {"team": self.teams[team].slug, "name": f"a{len(self.arrays) + len(self.refused)}",
                "kind": "training", "spec": spec, "array": {"count": count, "parallelism": parallelism}}
        r = self.client.post("/api/v1/arrays/", body, content_type="application/json")
        if r.status_code == 201:
            self.arrays[r.json()["id"]] = lifetime
            return r.json()["id"]
        if r.status_code >= 500:
            self.api_errors.append(f"POST /api/v1/arrays/ answered {r.status_code}")
        self.refused.append((r.status_code, body))
        return None

    def cancel(self, index: int) -> int | None:
        """Cancel the ``index``-th (modulo) unfinished job through the API; returns its id (None: none left)."""
        from jobs.models import FINAL_STATES, Job

        live = list(Job.objects.exclude(state__in=FINAL_STATES).order_by("pk").values_list("pk", flat=True))
        if not live:
            return None
        job_id = live[index % len(live)]
        r = self.client.post(f"/api/v1/jobs/{job_id}/cancel/")
        if r.status_code >= 500:
            self.api_errors.append(f"POST /api/v1/jobs/{job_id}/cancel/ answered {r.status_code}")
        return job_id

    def read_api(self) -> None:
        """The pages a user reads: the job list, each job, the cluster list; a 5xx, or a 404 for a job that
        exists, is recorded in ``api_errors``."""
        for path in ("/api/v1/jobs/", "/api/v1/clusters/"):
            r = self.client.get(path)
            if r.status_code != 200:
                self.api_errors.append(f"GET {path} answered {r.status_code}")
        for job_id in self.submitted[-3:]:
            r = self.client.get(f"/api/v1/jobs/{job_id}/")
            if r.status_code != 200:
                self.api_errors.append(f"GET /api/v1/jobs/{job_id}/ answered {r.status_code}")

    # --- the control plane ---------------------------------------------------------------------------------------

    def quota_lowered(self, team_id: int | None) -> bool:
        """Whether team ``team_id``'s (None: any team's) quota was lowered in this scenario: work admitted before
        may then hold more than the new quota (admitted work is not evicted for a quota change)."""
        return bool(self.lowered) if team_id is None else team_id in self.lowered

    def control_plane_downtime_since(self, since: dt.datetime) -> dt.timedelta:
        """How long the control plane was down after ``since`` (the outages' overlap with [since, now])."""
        now, total = self.clock.now(), dt.timedelta(0)
        for start, end in self.outages:
            overlap = min(end, now) - max(start, since)
            if overlap > dt.timedelta(0):
                total += overlap
        return total

    # --- actions -------------------------------------------------------------------------------------------------

    def apply(self, action: tuple) -> bool:
        """Play one action (see ``scenario``); returns whether it injected a fault."""
        kind, *args = action
        handler = getattr(self, f"do_{kind}")
        return bool(handler(*args))

    def _cluster(self, index: int) -> str:
        return self.config.clusters[index % len(self.config.clusters)].name

    def do_submit(self, team, shape, kind, preemptible, lifetime, max_retries, replicas) -> bool:
        from .scenario import SHAPES

        if self.after_restore_due:
            return False  # the platform is being restored: nobody reaches its API
        nodes, gpus = SHAPES[shape % len(SHAPES)]
        if not kind and replicas >= 3:  # a training submission drawn with 3 replicas is a sweep: an array
            self.submit_array(team % 2, nodes, gpus, bool(preemptible), lifetime, max_retries, count=replicas + 1,
                              parallelism=2)
        else:
            self.submit(team % 2, nodes, gpus, "inference" if kind else "training", bool(preemptible), lifetime,
                        max_retries, replicas)
        self.after_user_action()
        return False

    def do_cancel(self, index) -> bool:
        if self.after_restore_due:
            return False
        self.cancel(index)
        self.after_user_action()
        return False

    def after_user_action(self) -> None:
        if self.control_plane_up:
            self.work(order=None)
        self.read_api()

    def do_advance(self, seconds) -> bool:
        self.advance(seconds)
        return False

    def do_work(self, order_seed) -> bool:
        if self.control_plane_up:
            self.work(order=random.Random(order_seed))
        return False

    def do_api_faults(self, cluster, target, fault, count) -> bool:
        from tests.support.kubernetes import Fault

        from .scenario import FAULT_KINDS, FAULT_TARGETS

        method, path = FAULT_TARGETS[target % len(FAULT_TARGETS)]
        self.emulators[self._cluster(cluster)].inject(
            Fault(FAULT_KINDS[fault % len(FAULT_KINDS)], method=method, path=path, count=count, delay=1.2))
        return True

    def do_credential_rejected(self, cluster, count) -> bool:
        from tests.support.kubernetes import Fault

        self.emulators[self._cluster(cluster)].inject(Fault(401, count=count))
        return True

    def do_credential_unreadable(self, cluster, seconds) -> bool:
        """The cluster's stored credential becomes unreadable (encrypted under another key) for ``seconds``."""
        from runners.models import Cluster

        name = self._cluster(cluster)
        if name in self.unreadable:
            return False
        row = Cluster.objects.get(name=name)
        self.unreadable[name] = row.api_token
        self._write_unreadable(name)
        self.readable_at = getattr(self, "readable_at", {})
        self.readable_at[name] = self.clock.now() + dt.timedelta(seconds=seconds)
        return True

    @staticmethod
    def _write_unreadable(name: str) -> None:
        """Store cluster ``name``'s credential encrypted under a key the platform does not have."""
        from cryptography.fernet import Fernet
        from django.db import connection

        from runners.credentials import PREFIX
        from runners.models import Cluster

        foreign = PREFIX + Fernet(Fernet.generate_key()).encrypt(b"t").decode()
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Cluster._meta.db_table} SET api_token = %s WHERE name = %s", [foreign, name])

    def _restore_credentials(self, force: bool = False) -> None:
        from runners.models import Cluster

        for name, at in list(getattr(self, "readable_at", {}).items()):
            if force or self.clock.now() >= at:
                Cluster.objects.filter(name=name).update(api_token=self.unreadable.pop(name))
                del self.readable_at[name]

    def do_cluster_outage(self, cluster, seconds) -> bool:
        """The cluster's API server stops answering for ``seconds``; its pods keep running."""
        name = self._cluster(cluster)
        if name in self.cluster_back:
            return False
        self.emulators[name].stop()
        self.disturbed.add(name)
        self.cluster_back[name] = self.clock.now() + dt.timedelta(seconds=seconds)
        return True

    def _restart_clusters(self, force: bool = False) -> None:
        for name, at in list(self.cluster_back.items()):
            if force or self.clock.now() >= at:
                self.emulators[name].start()
                del self.cluster_back[name]

    def do_control_plane_outage(self, seconds) -> bool:
        """The control plane (workers, beat, API) is down for ``seconds``: the clusters go on without it; what
        was published before stays in the broker."""
        start = self.clock.now()
        self.control_plane_down_until = start + dt.timedelta(seconds=seconds)
        self.outages.append((start, self.control_plane_down_until))
        self.advance(seconds)
        self.control_plane_down_until = None
        return True

    def _node(self, cluster: str, index: int) -> str | None:
        nodes = sorted(n["metadata"]["name"] for n in self.emulators[cluster].objects("Node"))
        return nodes[index % len(nodes)] if nodes else None

    def do_spot_reclaim(self, cluster, node, replace) -> bool:
        """A spot node reclaimed by its provider (only on a spot cluster), a replacement joining or not."""
        name = self._cluster(cluster)
        if self.cluster_config(name).capacity != "spot":
            return False
        victim = self._node(name, node)
        if victim is None:
            return False
        self.emulators[name].interrupt_spot(victim)
        self.disturbed.add(name)
        self.reclaimed_nodes.add(victim)
        if replace or not self._node(name, 0):
            self.add_node(name)
        return True

    def do_node_loss(self, cluster, node, replace) -> bool:
        """A node vanishes (hardware loss, scale-down) without a provider's notice; a replacement joins or not."""
        name = self._cluster(cluster)
        victim = self._node(name, node)
        if victim is None:
            return False
        self.emulators[name].delete_node(victim)
        self.disturbed.add(name)
        if replace or not self._node(name, 0):
            self.add_node(name)
        return True

    def do_pod_disruption(self, cluster, pod, how) -> bool:
        """A running pod evicted (a drain) or deleted directly by someone else."""
        emulator = self.emulators[self._cluster(cluster)]
        running = sorted(p["metadata"]["name"] for p in emulator.pods()
                         if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))
        if not running:
            return False
        (emulator.evict if how else emulator.delete_pod)(running[pod % len(running)])
        return True

    def do_duplicate_delivery(self, index) -> bool:
        """A due message delivered twice (at least once delivery)."""
        self.worker.collect()
        due = self.worker.due(self.clock.now())
        if not due or not self.control_plane_up:
            return False
        message = due[index % len(due)]
        self.worker.deliver(message, keep=True)
        self.worker.deliver(message)
        return True

    def do_worker_kill(self, index) -> bool:
        """The worker dies after running a due message's task and before acknowledging it: the broker delivers
        it again once its visibility timeout passed."""
        self.worker.collect()
        due = self.worker.due(self.clock.now())
        if not due or not self.control_plane_up:
            return False
        message = due[index % len(due)]
        self.worker.deliver(message)
        timeout = float((self._transport_options() or {}).get("visibility_timeout", 300))
        self.worker.pending.append(dataclasses.replace(message, eta=self.clock.now() + dt.timedelta(seconds=timeout)))
        return True

    def do_late_delivery(self, index, seconds) -> bool:
        """A due message is held back ``seconds`` (a busy worker, a broker slow to hand it over): the others
        overtake it."""
        self.worker.collect()
        due = self.worker.due(self.clock.now())
        if not due:
            return False
        message = due[index % len(due)]
        message.eta = self.clock.now() + dt.timedelta(seconds=seconds)
        return True

    @staticmethod
    def _transport_options() -> dict:
        from django.conf import settings

        return getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}

    def do_price_change(self, cluster, cents, how) -> bool:
        """The cluster's price row changed (a new price from now) or, for ``how`` 0, deleted."""
        from costs.models import Price

        name = self._cluster(cluster)
        rows = Price.objects.filter(cluster__name=name)
        if how == 0:
            rows.delete()
        else:
            row = rows.order_by("-effective_from").first()
            if row is None:
                return False
            Price.objects.create(provider=row.provider, region=row.region, accelerator=row.accelerator,
                                 capacity_type=row.capacity_type, cluster=row.cluster,
                                 usd_per_gpu_hour=Decimal(cents) / 100, effective_from=self.clock.now())
        return True

    def do_quota_change(self, team, nominal, borrowing) -> bool:
        """An admin sets team ``team``'s quota."""
        from quotas.models import Quota

        quota = Quota.objects.get(team=self.teams[team % 2], cluster__isnull=True)
        if nominal < quota.nominal_gpus or borrowing < quota.borrowing_limit_gpus:
            self.lowered.add(quota.team_id)
        Quota.objects.filter(pk=quota.pk).update(nominal_gpus=nominal, borrowing_limit_gpus=borrowing)
        return False

    def _pg_args(self) -> list[str]:
        from django.db import connection

        db = connection.settings_dict
        return ["-h", db["HOST"] or "127.0.0.1", "-p", str(db["PORT"] or 5432), "-U", db["USER"] or "postgres",
                "-d", db["NAME"]]

    def do_backup(self) -> bool:
        """An online ``pg_dump -Fc`` of the platform's database (what continuous backups restore to)."""
        import subprocess
        import tempfile

        from django.db import connection

        from runners.models import installation

        if connection.vendor != "postgresql":
            return False
        installation()  # the installation row, as its migration made it in production
        path = str(Path(tempfile.gettempdir()) / f"sim-backup-{os.getpid()}.dump")
        subprocess.run(["pg_dump", "-Fc", "-f", path, *self._pg_args()], check=True, capture_output=True, timeout=120)
        self.backup = (path, list(self.submitted))
        return False

    def do_restore(self) -> bool:
        """The database is lost and restored from the latest backup (``pg_restore --clean``) while the clusters go
        on; the control plane stays down until ``manage.py after_restore`` passed (it is tried again each step
        while a cluster does not answer), as the runbook says (``platform/restore.md``)."""
        import subprocess

        from django.db import connections

        from core.lookups import clear_all
        from jobs.models import Job
        from runners.models import Cluster

        if self.backup is None:
            return False
        path, submitted = self.backup
        connections.close_all()
        subprocess.run(["pg_restore", "--clean", "--if-exists", "--single-transaction", "--no-owner",
                        *self._pg_args(), path], check=True, capture_output=True, timeout=120)
        clear_all()  # the processes start again: nothing cached survives
        for c in self.config.clusters:  # the owners' credentials as they are now, not as backed up
            if c.name in self.unreadable:
                self._write_unreadable(c.name)
            else:
                row = Cluster.objects.get(name=c.name)
                row.api_token = f"t-{c.name}"
                row.save(update_fields=["api_token"])
        kept = set(Job.objects.filter(pk__in=self.submitted).values_list("pk", flat=True))
        self.submitted = [j for j in self.submitted if j in kept]  # queued after the backup: lost with it
        self.restores += 1
        self.after_restore_due = True
        self.outages.append((self.clock.now(), self.clock.now()))
        self._after_restore()
        return True

    def _after_restore(self) -> None:
        from django.core.management import CommandError, call_command

        try:
            call_command("after_restore", stdout=io.StringIO(), stderr=io.StringIO())
        except CommandError:
            return  # a cluster did not answer, or staff must decide: tried again next step
        self.after_restore_due = False

    def do_slow_termination(self, cluster, seconds) -> bool:
        """From now on the cluster's pods run ``seconds`` after their Job or Deployment is deleted (Terminating,
        their GPUs held), as containers given a termination grace period do: victims slow to go."""
        self.emulators[self._cluster(cluster)].termination_grace = float(seconds)
        return True

    def do_budget_change(self, team, dollars, block) -> bool:
        """An admin sets team ``team``'s monthly budget to ``dollars`` (0: removes it), alerting or blocking."""
        from quotas.models import Budget

        team_row = self.teams[team % 2]
        Budget.objects.filter(team=team_row).delete()
        if dollars:
            Budget.objects.create(team=team_row, amount_usd=Decimal(dollars),
                                  action=Budget.Action.BLOCK if block else Budget.Action.ALERT)
        return False

    def settle(self, seconds: float) -> None:
        """Faults stop: every cluster answers again, credentials read, quotas are back to their first values and
        budgets gone,
        inference jobs are cancelled (a service runs until someone stops it); time passes until every job is
        final or ``seconds`` went by, then the ledger accrues to now."""
        from jobs.models import FINAL_STATES, Job
        from quotas.models import Quota

        self.control_plane_down_until = None
        self._restart_clusters(force=True)
        self._restore_credentials(force=True)
        for emulator in self.emulators.values():
            emulator.faults.clear()
            emulator.fault_rate = 0.0
        from quotas.models import Budget

        Budget.objects.all().delete()
        for team_id, (nominal, borrowing) in self.initial_quotas.items():
            Quota.objects.filter(team_id=team_id, cluster__isnull=True).update(nominal_gpus=nominal,
                                                                               borrowing_limit_gpus=borrowing)
        waited = 0.0
        while waited < seconds:
            for job_id in Job.objects.filter(kind="inference").exclude(state__in=FINAL_STATES).exclude(
                    state="CANCELLING").values_list("pk", flat=True):
                self.client.post(f"/api/v1/jobs/{job_id}/cancel/")
            self.advance(30)
            waited += 30
            if not Job.objects.exclude(state__in=FINAL_STATES).exists() and not any(
                    e.pods() or e.objects("Job") or e.objects("Deployment") for e in self.emulators.values()):
                break
        self.advance(120)  # the last reconcile and accrual passes
        self.worker.app.tasks["costs.tasks.accrue_running_costs"].run()
        self.read_api()

    @property
    def control_plane_up(self) -> bool:
        return (not self.after_restore_due
                and (self.control_plane_down_until is None or self.clock.now() >= self.control_plane_down_until))

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass in steps of at most 5 s: the clusters' controllers run each step;
        while the control plane is up, beat publishes what is due and the worker delivers what is due."""
        left = seconds
        while left > 0:
            step = min(5.0, left)
            self.clock.advance(step)
            left -= step
            self._restart_clusters()
            self._restore_credentials()
            for emulator in self.emulators.values():
                emulator.step()
            if self.after_restore_due:
                start, _ = self.outages[-1]
                self._after_restore()
                self.outages[-1] = (start, self.clock.now())
            if self.control_plane_up:
                self.worker.beat(self.clock.now())
                self.work(order=None)

    def work(self, order: random.Random | None, limit: int = 200) -> int:
        """Deliver the due messages (in publication order, or shuffled by ``order``) until none is due; returns
        how many were delivered."""
        delivered = 0
        while delivered < limit:
            self.worker.collect()
            due = self.worker.due(self.clock.now())
            if not due:
                break
            message = order.choice(due) if order is not None else due[0]
            self.worker.deliver(message)
            delivered += 1
        return delivered
