"""GPU utilization per role of a multi-role job, read through a real Prometheus (docs/adr/0039-multi-role-jobs.md).

A promtool-built Prometheus holds dcgm-exporter series of three attempts of
the same shape (a learner of one pod x 2 GPUs, a rollout of two pods x 1 GPU):

* ``sharepod`` on a cluster whose series carry the pod labels: the learner
  and rollout pod 0 share node pa, rollout pod 1 is alone on pb;
* ``sharehost`` the same on a cluster whose series carry only ``Hostname``
  and ``UUID`` (the attempt's GPU UUIDs recorded by the runner), nodes ha, hb;
* ``exclusive`` on that cluster with each role on nodes of its own (hc; hd, he).

One GPU of each shared node belongs to no pod and sits idle all along. Expected figures are counted here from the
listed scrapes inside each run: samples, their sum, observed and idle instants under Prometheus' lookback
(``tests.support.lookback``), then given to the roles by the documented rule: by the pod's role where the series
name the pod, by the node where one role holds it, else in shares of the GPUs each role holds on the node.
"""

from __future__ import annotations

import datetime as dt
from datetime import UTC

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from costs.collection import collect_utilization, periodic_pass, seal_after
from costs.ledger import accrue_attempt
from costs.models import ClusterMetrics, NodeUtilizationRollup, UtilizationRollup
from costs.prometheus import pod_role
from jobs.models import JobState
from jobs.roles import attribute_attempt, role_utilization
from quotas.models import Team
from runners.models import Node
from tests.support import lookback
from tests.support.factories import make_attempt, make_cluster, make_job_row
from tests.support.personas import make_persona, signed_in
from tests.support.prometheus import read_costs_from, serving

pytestmark = pytest.mark.django_db
STEP, LOOKBACK, IDLE = 60, 300, 5.0
HOUR = 3600.0
T0 = dt.datetime(2026, 5, 4, 10, tzinfo=UTC)
T1 = T0 + dt.timedelta(hours=2)
DAY0, DAY1 = dt.datetime(2026, 5, 4, tzinfo=UTC), dt.datetime(2026, 5, 5, tzinfo=UTC)
TEAM = "roleutil"
NAMESPACE = f"cp-{TEAM}"
POD_CLUSTER, HOST_CLUSTER = "rolepod", "rolehost"
SUFFIX = {("learner", 0): "x7k2p", ("rollout", 0): "ab12c", ("rollout", 1): "cd34e"}
# attempt: (cluster, {role: (GPUs per pod, [node of each pod])})
RUNS = {
    "sharepod": (POD_CLUSTER, {"learner": (2, ["pa"]), "rollout": (1, ["pa", "pb"])}),
    "sharehost": (HOST_CLUSTER, {"learner": (2, ["ha"]), "rollout": (1, ["ha", "hb"])}),
    "exclusive": (HOST_CLUSTER, {"learner": (2, ["hc"]), "rollout": (1, ["hd", "he"])}),
}
# (attempt, node, gpu): ((role, pod index) or None for no pod, utilization values cycled one per scrape, minutes
# after T0 without a scrape)
PATTERN = {
    (0, 0): (("learner", 0), [90.0, 70.0], ()),
    (0, 1): (("learner", 0), [80.0, 3.0, 60.0], ()),
    (0, 2): (("rollout", 0), [2.0, 4.0, 50.0], ()),
    (1, 0): (("rollout", 1), [1.0], range(30, 50)),
    (0, 3): (None, [0.0], ()),
}


def gpus() -> dict[tuple[str, str, int], tuple]:
    """Every GPU series: (attempt, node, gpu) -> ((role, index) or None, values, gaps). Shared layouts use the
    pattern as it is; the exclusive one puts the learner on hc, rollout pod 0 on hd, rollout pod 1 on he."""
    out = {}
    for attempt in ("sharepod", "sharehost"):
        nodes = ["pa", "pb"] if attempt == "sharepod" else ["ha", "hb"]
        for (n, gpu), spec in PATTERN.items():
            out[(attempt, nodes[n], gpu)] = spec
    out[("exclusive", "hc", 0)] = (("learner", 0), [95.0, 85.0], ())
    out[("exclusive", "hc", 1)] = (("learner", 0), [2.0, 90.0], range(60, 75))
    out[("exclusive", "hd", 0)] = (("rollout", 0), [1.0, 1.0, 40.0], ())
    out[("exclusive", "he", 0)] = (("rollout", 1), [3.0], ())
    return out


GPUS = gpus()


def scrapes(pod, values, skip) -> list[tuple[float, float]]:
    """``[(unix seconds, percent)]`` at second 45 of each minute from a minute before the run to three minutes
    past it (the pod label outlives the run a little); a GPU of no pod the hour around it too."""
    lo, hi = (T0 - dt.timedelta(hours=1), T1 + dt.timedelta(hours=1)) if pod is None else (
        T0 - dt.timedelta(minutes=1), T1 + dt.timedelta(minutes=3))
    out, t, i = [], int(lo.timestamp()) // STEP * STEP + 45, 0
    while t < hi.timestamp():
        if (t - int(T0.timestamp())) // STEP not in skip:
            out.append((float(t), values[i % len(values)]))
        i += 1
        t += STEP
    return out


SERIES = {key: scrapes(*spec) for key, spec in GPUS.items()}


def object_name(attempt: str) -> str:
    return f"grpo-{attempt}-1"


def pod_name(attempt: str, role: str, index: int) -> str:
    """The pod as Kubernetes names an Indexed Job's: ``<object>-<role>-<index>-<suffix>``."""
    return f"{object_name(attempt)}-{role}-{index}-{SUFFIX[(role, index)]}"


def uuid(attempt: str, node: str, gpu: int) -> str:
    return f"GPU-{attempt}-{node}-{gpu}"


def openmetrics() -> str:
    util, requests = [], []
    for (attempt, node, gpu), (pod, _, _) in GPUS.items():
        cluster = RUNS[attempt][0]
        labels = f'cluster="{cluster}",gpu="{gpu}",UUID="{uuid(attempt, node, gpu)}",Hostname="{node}"'
        if pod is not None and cluster == POD_CLUSTER:
            labels += f',namespace="{NAMESPACE}",pod="{pod_name(attempt, *pod)}",container="main"'
        util += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {v:g} {t:.0f}" for t, v in SERIES[(attempt, node, gpu)]]
    for attempt, (cluster, roles) in RUNS.items():
        for role, (per_pod, nodes) in roles.items():
            for index, node in enumerate(nodes):
                labels = (f'cluster="{cluster}",namespace="{NAMESPACE}",pod="{pod_name(attempt, role, index)}",'
                          f'container="main",node="{node}",resource="nvidia_com_gpu",unit="integer"')
                requests += [f"kube_pod_container_resource_requests{{{labels}}} {per_pod} {t:.0f}"
                             for t, _ in scrapes(("x", 0), [0.0], ())]
    return "\n".join(["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", *util,
                      "# TYPE kube_pod_container_resource_requests gauge", *requests, "# EOF"]) + "\n"


def gpu_sums(key) -> dict[str, float]:
    """One GPU's samples, their sum, observed and idle GPU-seconds inside the run."""
    series = SERIES[key]
    inside = [v for t, v in series if T0.timestamp() <= t < T1.timestamp()]
    observed, idle = lookback.instants(series, T0.timestamp(), T1.timestamp(), STEP, LOOKBACK, IDLE)
    return {"samples": len(inside), "util_sum": sum(inside), "observed": observed, "idle": idle}


def add(into: dict, sums: dict, share: float = 1.0) -> None:
    for k, v in sums.items():
        into[k] = into.get(k, 0.0) + v * share


def figures(s: dict) -> dict:
    """The API's figures of a role from its sums."""
    return {"gpu_utilization_percent": pytest.approx(s["util_sum"] / s["samples"], abs=0.006),
            "observed_gpu_hours": pytest.approx(s["observed"] / HOUR, abs=1e-6),
            "idle_gpu_hours": pytest.approx(s["idle"] / HOUR, abs=1e-6)}


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("role-util"), openmetrics()) as url:
        yield url


@pytest.fixture
def fleet(settings, prometheus_url, catalog):
    read_costs_from(settings, prometheus_url, step=STEP, idle_percent=IDLE, lookback=LOOKBACK)
    staff = make_persona("operator", staff=True)
    team = Team.objects.create(slug=TEAM, name="Role utilization")
    h100 = catalog["H100-80GB"]
    clusters = {name: make_cluster(name, "aws", "us-east-1", h100, price="4.00") for name in (POD_CLUSTER,
                                                                                               HOST_CLUSTER)}
    ClusterMetrics.objects.create(cluster=clusters[HOST_CLUSTER][0], shape_override="host")
    for name, nodes in ((POD_CLUSTER, ("pa", "pb")), (HOST_CLUSTER, ("ha", "hb", "hc", "hd", "he"))):
        cluster, pool = clusters[name]
        for node in nodes:
            Node.objects.create(cluster=cluster, node_pool=pool, name=node, gpus=4, cpu_milli=64_000,
                                memory_mib=512 * 1024, seen_at=T0)
    attempts = {}
    for key, (cluster_name, roles) in RUNS.items():
        spec = {"roles": {role: {"image": "python:3.11", "command": ["python", "rl.py"], "env": {},
                                 "resources": {"accelerator": "H100-80GB", "gpus_per_node": per_pod,
                                               "nodes": len(nodes)}, "completion": role == "learner"}
                          for role, (per_pod, nodes) in roles.items()},
                "priority": "normal", "max_runtime_seconds": 86400, "preemptible": False, "placement": {},
                "max_retries": 0}
        job = make_job_row(team, staff.user, h100, name=key, kind="multi-role", spec=spec, nodes=3, gpus_per_node=1,
                           max_runtime=86400, state=JobState.SUCCEEDED)
        cluster, pool = clusters[cluster_name]
        attempt = make_attempt(job, cluster, pool, gpus=4, started_at=T0, ended_at=T1, state=JobState.SUCCEEDED,
                               object_name=object_name(key))
        attempt.placement = {"roles": {role: {"nodes": nodes, "gpus_per_node": per_pod, "cpu_milli": 0,
                                              "memory_mib": 0} for role, (per_pod, nodes) in roles.items()},
                             "nodes": [n for _, nodes in roles.values() for n in nodes]}
        if cluster_name == HOST_CLUSTER:  # the runner recorded the GPUs it gave the attempt's pods
            attempt.runner_state = {"gpu_uuids": [uuid(a, n, g) for (a, n, g), (pod, _, _) in GPUS.items()
                                                  if a == key and pod is not None]}
        attempt.save(update_fields=["placement", "runner_state"])
        accrue_attempt(attempt.pk, until=T1)
        attempts[key] = attempt
    return {"staff": staff, "attempts": attempts}


def roles_of(fleet, key: str) -> dict:
    answer = fleet["staff"].client.get(f"/api/v1/jobs/{fleet['attempts'][key].job_id}/")
    assert answer.status_code == 200, answer.content
    return answer.json()["roles"]


def assert_role(got: dict, sums: dict, attribution: str) -> None:
    assert {k: got[k] for k in ("gpu_utilization_percent", "observed_gpu_hours", "idle_gpu_hours")} == figures(sums)
    assert got["attribution"] == attribution


def test_a_node_two_roles_share_is_told_apart_by_pod_where_series_name_it_and_split_by_gpus_where_not(fleet):
    collect_utilization(DAY0, DAY1)
    # Pod labels: each GPU's series goes to its pod's role, wherever the pod ran.
    by_pod: dict[str, dict] = {}
    for (attempt, _node, _gpu), (pod, _, _) in GPUS.items():
        if attempt == "sharepod" and pod is not None:
            add(by_pod.setdefault(pod[0], {}), gpu_sums((attempt, _node, _gpu)))
    roles = roles_of(fleet, "sharepod")
    for role in ("learner", "rollout"):
        assert_role(roles[role], by_pod[role], "pod")
    assert set(NodeUtilizationRollup.objects.filter(attempt=fleet["attempts"]["sharepod"]).values_list(
        "node", "role")) == {("pa", "learner"), ("pa", "rollout"), ("pb", "rollout")}
    page = signed_in(fleet["staff"]).get(f"/jobs/{fleet['attempts']['sharepod'].job_id}/").content.decode()
    learner = by_pod["learner"]
    assert f'id="role-util-learner">{learner["util_sum"] / learner["samples"]:.1f} %<' in page
    assert f'id="role-idle-learner">{learner["idle"] / HOUR:.2f}<' in page
    assert 'id="role-attribution-rollout">pod<' in page

    # Hostname only: node ha holds the learner's 2 GPUs and rollout pod 0's 1, so its samples go 2/3 and 1/3;
    # hb is the rollout's alone. Its idle GPU 3 is nobody's.
    ha, hb = {}, {}
    for gpu in (0, 1, 2):
        add(ha, gpu_sums(("sharehost", "ha", gpu)))
    add(hb, gpu_sums(("sharehost", "hb", 0)))
    learner, rollout = {}, {}
    add(learner, ha, 2 / 3)
    add(rollout, ha, 1 / 3)
    add(rollout, hb)
    roles = roles_of(fleet, "sharehost")
    assert_role(roles["learner"], learner, "gpu-share")
    assert_role(roles["rollout"], rollout, "gpu-share")  # its hb time by node, its ha time by share: the latter
    # Shares are not measurements: the learner's average is the node's, whatever its own GPUs did.
    assert roles["learner"]["gpu_utilization_percent"] == pytest.approx(ha["util_sum"] / ha["samples"], abs=0.006)


def test_role_exclusive_nodes_are_attributed_by_node(fleet):
    collect_utilization(DAY0, DAY1)
    learner, rollout = {}, {}
    for gpu in (0, 1):
        add(learner, gpu_sums(("exclusive", "hc", gpu)))
    add(rollout, gpu_sums(("exclusive", "hd", 0)))
    add(rollout, gpu_sums(("exclusive", "he", 0)))
    roles = roles_of(fleet, "exclusive")
    assert_role(roles["learner"], learner, "node")
    assert_role(roles["rollout"], rollout, "node")
    # hc's gap leaves some of the learner's allocation unobserved: 2 GPUs x 2 h held, less observed.
    assert roles["learner"]["observed_gpu_hours"] < roles["learner"]["gpu_hours"] == pytest.approx(4.0)


@pytest.mark.parametrize("key", list(RUNS))
def test_the_roles_idle_and_observed_gpu_hours_add_up_to_the_attempts(fleet, key):
    collect_utilization(DAY0, DAY1)
    attempt = fleet["attempts"][key]
    rows = UtilizationRollup.objects.filter(attempt=attempt)
    idle = sum(r.idle_gpu_seconds for r in rows) / HOUR
    observed = sum(r.observed_gpu_seconds for r in rows) / HOUR
    # The attempt's own figures against the scrapes of its pods' GPUs: the idle GPU of no pod counts nowhere.
    own = {}
    for (a, node, gpu), (pod, _, _) in GPUS.items():
        if a == key and pod is not None:
            add(own, gpu_sums((a, node, gpu)))
    assert idle == pytest.approx(own["idle"] / HOUR, abs=1e-9)
    assert observed == pytest.approx(own["observed"] / HOUR, abs=1e-9)
    roles = roles_of(fleet, key)
    assert sum(r["idle_gpu_hours"] for r in roles.values()) == pytest.approx(idle, abs=1e-5)
    assert sum(r["observed_gpu_hours"] for r in roles.values()) == pytest.approx(observed, abs=1e-5)
    assert all(r["idle_gpu_hours"] <= r["observed_gpu_hours"] for r in roles.values())


def test_periodic_passes_attribute_what_one_read_does(fleet):
    collect_utilization(DAY0, DAY1)
    whole = {key: role_utilization(a.job) for key, a in fleet["attempts"].items()}
    NodeUtilizationRollup.objects.all().delete()
    UtilizationRollup.objects.all().delete()
    now, last = T0 - dt.timedelta(minutes=10), T1 + seal_after() + dt.timedelta(hours=1)
    while now <= last:
        periodic_pass(now)
        now += dt.timedelta(minutes=15)
    assert UtilizationRollup.objects.filter(sealed=False).count() == 0
    for key, attempt in fleet["attempts"].items():
        got = role_utilization(attempt.job)
        for role, want in whole[key].items():
            assert got[role]["attribution"] == want["attribution"]
            for field in ("gpu_utilization_percent", "observed_gpu_hours", "idle_gpu_hours"):
                assert got[role][field] == pytest.approx(want[field], abs=1e-5), (key, role, field)


def test_a_role_never_observed_shows_null_not_zero(fleet):
    roles = roles_of(fleet, "sharepod")  # nothing collected yet
    for role in roles.values():
        assert role["gpu_utilization_percent"] is None and role["idle_gpu_hours"] is None
        assert role["attribution"] is None and role["observed_gpu_hours"] == 0
        assert role["tokens_per_s"] is None and role["throughput_attempt"] is None
    assert roles["rollout"]["pod_tokens_per_s"] == [None, None]


def test_a_pod_s_role_is_the_longest_role_its_name_starts_with_followed_by_an_index():
    roles = ("a", "a-b", "rollout")
    assert pod_role("job-7-1-a-b-0-x7k2p", "job-7-1", roles) == "a-b"
    assert pod_role("job-7-1-a-0-x7k2p", "job-7-1", roles) == "a"
    assert pod_role("job-7-1-rollout-12", "job-7-1", roles) == "rollout"
    assert pod_role("job-7-1-rollouts-0", "job-7-1", roles) == ""  # not a role of this attempt
    assert pod_role("job-7-10-a-0", "job-7-1", roles) == ""  # another attempt's pod


def test_time_of_series_without_a_node_is_split_by_the_roles_gpus_in_the_attempt():
    """Hand-worked: the learner holds 3 GPUs, the rollout 1; node n1 (the learner's alone) has 30 samples; the
    attempt's rows hold 10 more samples, 400 % more and 600 s more, idle 600 s, with no node: 3/4 and 1/4."""
    placement = {"roles": {"learner": {"nodes": ["n1"], "gpus_per_node": 3},
                           "rollout": {"nodes": ["n2"], "gpus_per_node": 1}}}
    node = {"samples": 30, "util_sum": 1500.0, "observed": 1800.0, "idle": 0.0}
    total = {"samples": 40, "util_sum": 1900.0, "observed": 2400.0, "idle": 600.0}
    got = attribute_attempt(placement, total, [("n1", "", node)])
    assert got["learner"]["samples"] == pytest.approx(30 + 7.5)
    assert got["learner"]["util_sum"] == pytest.approx(1500 + 300)
    assert got["learner"]["idle"] == pytest.approx(450)
    assert got["rollout"]["samples"] == pytest.approx(2.5) and got["rollout"]["observed"] == pytest.approx(150)
    assert got["learner"]["rules"] == {"node", "gpu-share"} and got["rollout"]["rules"] == {"gpu-share"}


NODES = ("n1", "n2", "n3")


@st.composite
def attempts(draw):
    """A multi-role placement over a few nodes (each role's pods on distinct nodes), node rows with and without a
    role, and attempt totals holding at least the node rows (more: series without a host label)."""
    roles = {}
    for name in draw(st.lists(st.sampled_from(("learner", "rollout", "reward")), min_size=1, max_size=3,
                              unique=True)):
        nodes = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True))
        roles[name] = {"nodes": nodes, "gpus_per_node": draw(st.integers(1, 4))}
    sums = st.fixed_dictionaries({"samples": st.integers(0, 500), "util_sum": st.floats(0, 5e4),
                                  "observed": st.floats(0, 1e5), "idle": st.floats(0, 1e5)})
    rows = draw(st.lists(st.tuples(st.sampled_from(NODES + ("elsewhere",)), st.sampled_from(["", *roles]), sums),
                         max_size=6, unique_by=lambda r: (r[0], r[1])))
    extra = draw(sums)
    total = {k: extra[k] + sum(r[2][k] for r in rows) for k in extra}
    return {"roles": roles}, total, rows


@examples(max_examples=200, deadline=None)
@given(attempts())
def test_every_rows_time_goes_to_the_roles_once(case):
    placement, total, rows = case
    got = attribute_attempt(placement, total, rows)
    assert set(got) == set(placement["roles"])
    for key in total:
        # What the node rows leave of the attempt's totals is float rounding when within a millionth of the total
        # (jobs.roles' noise rule), and then not split: the roles' sums match the total to that millionth.
        assert sum(r[key] for r in got.values()) == pytest.approx(total[key], rel=2e-6, abs=1e-6)
        assert all(r[key] >= -1e-6 for r in got.values())
    for node, role, _sums in rows:
        if role:
            assert "pod" in got[role]["rules"]
        holders = [name for name, r in placement["roles"].items() if node in r["nodes"]]
        if not role and len(holders) == 1:
            assert "node" in got[holders[0]]["rules"]
