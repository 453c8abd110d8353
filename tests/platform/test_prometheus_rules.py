"""platform/prometheus: promtool accepts the rules and their unit tests pass; the rules read only series that
this project, django-prometheus, dcgm-exporter, kube-state-metrics or Prometheus itself export; the alerts'
job names are the example scrape configuration's, and its relabelling keeps the manifests' ports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django_prometheus.middleware import Metrics
from prometheus_client.metrics import MetricWrapperBase

from .kustomize import KUBERNETES, PLATFORM, load_documents, render

REPO = PLATFORM.parent
PROMETHEUS = PLATFORM / "prometheus"
RULE_FILES = [PROMETHEUS / "recording-rules.yaml", PROMETHEUS / "alerting-rules.yaml"]
RULE_TESTS = PROMETHEUS / "tests" / "alerting-rules.test.yaml"
PROJECT_PACKAGES = ["controlplane", "costs", "jobs", "quotas", "runners", "frontend"]

# Series the rules may read that other software exports, with the code of this project that relies on them.
EXTERNAL = {
    "DCGM_FI_DEV_GPU_UTIL": "costs/prometheus.py",  # dcgm-exporter
    "DCGM_FI_DEV_FB_USED": "costs/prometheus.py",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "costs/prometheus.py",
    "kube_pod_container_resource_requests": "costs/prometheus.py",  # kube-state-metrics
    "kube_pod_status_phase": "costs/prometheus.py",
    "kube_pod_info": "costs/prometheus.py",
}
# Prometheus' own series for every target.
SYNTHETIC = {"up"}

PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "offset", "inf", "nan"}
CONSTRUCTOR = re.compile(r"\b(Counter|Gauge|Histogram|Summary|GaugeMetricFamily|CounterMetricFamily)"
                         r"\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")


def series_names(name: str, kind: str) -> set[str]:
    """The sample names prometheus_client exposes for a metric ``name`` of ``kind`` (its text format)."""
    if kind in ("Counter", "CounterMetricFamily", "counter"):
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind in ("Histogram", "histogram"):
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind in ("Summary", "summary"):
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    return {name}


def project_series() -> set[str]:
    """Every series the project's own code exports: prometheus_client metrics and custom collectors' families."""
    names = set()
    for package in PROJECT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for kind, name in CONSTRUCTOR.findall(path.read_text()):
                names |= series_names(name, kind)
    return names


def django_prometheus_series() -> set[str]:
    names = set()
    for metric in vars(Metrics.get_instance()).values():
        if isinstance(metric, MetricWrapperBase):
            for described in metric.describe():
                names |= series_names(described.name, described.type)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside strings, label matchers, ranges and
    grouping clauses that are neither functions nor keywords."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', '""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", expr)
    return set(names) - PROMQL_KEYWORDS


def rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in load_documents(path)[0]["groups"] for rule in group["rules"]]


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    assert binary, "promtool is not on PATH (Debian package prometheus; .ci/run installs it)"
    return subprocess.run([binary, *args], check=False, capture_output=True, text=True, timeout=120)


# --- promtool ----------------------------------------------------------------------------------------------------

def test_promtool_checks_the_rules():
    result = promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_unit_tests_pass():
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_core_alerts_have_unit_tests():
    """The alerts on the control plane's core paths have a promtool test; every tested alert exists."""
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    for alert in ["ControlPlaneJobsStuckQueued", "ControlPlaneBudgetExceeded", "ControlPlaneDispatchStalled",
                  "ControlPlaneCeleryWorkerDown", "ControlPlanePeriodicTasksStalled", "ControlPlaneLedgerDiscrepancy",
                  "TeamGPUsIdle"]:
        assert alert in tested
    assert tested <= {rule["alert"] for rule in rules() if "alert" in rule}


# --- metric names ------------------------------------------------------------------------------------------------

def test_the_name_extractor_reads_promql():
    assert metric_names('sum by (le) (rate(a_bucket{x="y z",le!="1"}[5m])) / on (c) group_left () b offset 1m') == \
        {"a_bucket", "b"}
    assert metric_names('histogram_quantile(0.95, x:y:z) > 1e3 and bool absent(up{job="w"} == 1)') == {"x:y:z", "up"}


def test_the_allow_list_comes_from_the_code():
    project = project_series()
    assert {"controlplane_queue_depth", "controlplane_jobs", "controlplane_admissions_total",
            "controlplane_budget_spent_usd", "controlplane_ledger_discrepancy_percent",
            "controlplane_dispatch_duration_seconds_bucket"} <= project
    assert "django_http_responses_total_by_status_view_method_total" in django_prometheus_series()
    for name, source in EXTERNAL.items():
        assert name in (REPO / source).read_text(), f"{source} no longer reads {name}: drop it from EXTERNAL"


def test_the_rules_read_only_exported_or_recorded_series():
    allowed = project_series() | django_prometheus_series() | set(EXTERNAL) | SYNTHETIC
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    for rule in rules():
        unknown = metric_names(rule["expr"]) - allowed - recorded
        assert not unknown, f"{rule.get('record') or rule.get('alert')} reads {sorted(unknown)}"


def test_recorded_names_follow_the_level_metric_operations_convention():
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]


def test_every_alert_has_a_severity_and_explains_itself():
    for rule in rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


# --- scraping ----------------------------------------------------------------------------------------------------

def scrape_configs() -> dict[str, dict]:
    config = yaml.safe_load((PROMETHEUS / "prometheus.example.yml").read_text())
    assert [Path(p).name for p in config["rule_files"]] == [p.name for p in RULE_FILES]
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_the_alerts_read_the_jobs_that_the_scrape_configuration_defines():
    jobs = set(scrape_configs())
    for rule in rules():
        for job in re.findall(r'\bjob="([^"]+)"', rule["expr"]):
            assert job in jobs, f"{rule.get('alert') or rule.get('record')} reads job {job}"


@pytest.mark.parametrize("job,deployment_name", [("controlplane-web", "controlplane-web"),
                                                 ("controlplane-worker", "controlplane-worker-fast"),
                                                 ("controlplane-worker", "controlplane-worker-slow")])
def test_the_scrape_configuration_keeps_the_metrics_ports_of_the_pods(job, deployment_name):
    keep = next(r for r in scrape_configs()[job]["relabel_configs"] if r.get("action") == "keep")
    deployment = next(obj for obj in render(KUBERNETES / "base")
                      if obj["kind"] == "Deployment" and obj["metadata"]["name"] == deployment_name)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert ports
    for port in ports:
        value = ";".join([labels["app.kubernetes.io/name"], labels["app.kubernetes.io/component"], port["name"]])
        assert re.fullmatch(keep["regex"], value), value  # Prometheus anchors relabel regexes at both ends
