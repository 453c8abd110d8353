"""The Prometheus path of the workload metrics on a Kubernetes cluster: training pods declare the metrics port
(container port ``metrics``, env CONTROLPLANE_METRICS_PORT, ``prometheus.io/*`` annotations); the periodic
collection scrapes node 0's pod through the API server's pod proxy and the throughput and MFU read back through
the REST API are those of its exposition; a scrape that fails keeps the figures; the collection before an
attempt's objects are deleted scrapes too.

Expected figures are computed here from the exposition's own numbers and the protocol's definitions (one report
per scrape, step-weighted harmonic mean of tokens/s; MFU = tokens/s x FLOPs per token over GPUs x the catalog's
peak dense BF16 FLOP/s), not read from the platform.
"""

from __future__ import annotations

import pytest

from jobs.lifecycle import delete_ended_attempt, dispatch, preempt_attempt
from jobs.models import Job, JobState, WorkloadMetrics
from jobs.workload import collect_workload_metrics
from runners.kubernetes.client import ApiError, client_for
from runners.kubernetes.runner import pod_of_node
from tests.support.clusters import load, state

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs/"
FLOPS_PER_TOKEN = 4.32e10


def exposition(step: int, tokens_per_s: float, tokens: int, loss: float) -> str:
    """Rank 0's ``/metrics`` after ``step`` steps, in the text format ``examples/workload_metrics.py`` serves."""
    return ("# HELP workload_step Optimizer steps done.\n# TYPE workload_step gauge\n"
            f"workload_step {step}\n"
            "# TYPE workload_tokens_per_second gauge\n"
            f"workload_tokens_per_second {tokens_per_s!r}\n"
            "# TYPE workload_loss gauge\n"
            f"workload_loss {loss!r}\n"
            "# TYPE workload_model_flops_per_token gauge\n"
            f"workload_model_flops_per_token {FLOPS_PER_TOKEN!r}\n"
            "# TYPE workload_tokens_per_step gauge\nworkload_tokens_per_step 4096\n"
            "# TYPE workload_tokens counter\n"
            f"workload_tokens_total {tokens}\n")


def mfu_percent(tokens_per_s: float, gpus: int, peak_tflops: float) -> float:
    """MFU in percent (PaLM appendix B), rounded as the API shows it."""
    return round(100 * tokens_per_s * FLOPS_PER_TOKEN / (gpus * peak_tflops * 1e12), 4)


def running(world, nodes: int = 2):
    """A training job of ``nodes`` x 8 GPUs on gcp-usc1, dispatched and RUNNING; ``(attempt, pods by index)``."""
    attempt = world.admit(cluster="gcp-usc1", nodes=nodes, gpus=8)
    assert dispatch(attempt.pk) == "dispatched"
    world.reconcile("gcp-usc1")
    assert state(attempt) == JobState.RUNNING
    pods = world.emulator(attempt).pods(attempt.pk)
    return load(attempt.pk), [pod_of_node(pods, i)["metadata"]["name"] for i in range(nodes)]


def efficiency(client, job_id: int) -> dict:
    answer = client.get(f"{JOBS}{job_id}/")
    assert answer.status_code == 200, answer.content
    return answer.json()["efficiency"]


def test_training_pods_on_the_cluster_declare_the_metrics_port(live_clusters, settings):
    settings.K8S_METRICS_PORT = 9464
    attempt, _ = running(live_clusters)
    for pod in live_clusters.emulator(attempt).pods(attempt.pk):
        (container,) = pod["spec"]["containers"]
        assert {"name": "metrics", "containerPort": 9464} in container["ports"]
        assert {"name": "CONTROLPLANE_METRICS_PORT", "value": "9464"} in container["env"]
        assert {k: v for k, v in pod["metadata"]["annotations"].items() if k.startswith("prometheus.io/")} == {
            "prometheus.io/scrape": "true", "prometheus.io/port": "9464", "prometheus.io/path": "/metrics"}
    assert attempt.runner_state["metrics_port"] == 9464


def test_throughput_and_mfu_through_the_api_are_those_of_rank_0s_exposition(live_clusters, teammate):
    world = live_clusters
    attempt, (rank0, rank1) = running(world)
    emulator = world.emulator(attempt)
    peak = float(attempt.node_pool.accelerator.peak_bf16_tflops)
    gpus = attempt.gpus
    assert gpus == 16

    emulator.serve_metrics(rank0, exposition(100, 51200.5, 409600, 2.5))
    emulator.serve_metrics(rank1, exposition(900, 1.0, 1, 9.0))  # another rank's gauges are never read
    assert collect_workload_metrics() == {"collected": 1, "unreachable": 0}
    body = efficiency(teammate.client, attempt.job_id)
    assert body["tokens_per_s"] == 51200.5
    assert body["mfu_percent"] == mfu_percent(51200.5, gpus, peak) and body["mfu_reason"] == ""
    run = body["attempts"][0]
    assert run["source"] == "prometheus" and run["reports"] == 1
    assert run["last"] == {"step": 100, "tokens_per_s": 51200.5, "samples_per_s": None, "step_time_s": None,
                           "loss": 2.5}
    assert (run["tokens"], run["flops_per_token"], run["flops_source"]) == (409600, FLOPS_PER_TOKEN, "workload")

    # Step 300 at 60,000 tokens/s: the run's throughput is the step-weighted harmonic mean, the tokens of the
    # reported intervals over their time; the first report weighs one step, the second the 200 since.
    emulator.serve_metrics(rank0, exposition(300, 60000.0, 1228800, 2.0))
    collect_workload_metrics()
    mean = (1 + 200) / (1 / 51200.5 + 200 / 60000.0)
    body = efficiency(teammate.client, attempt.job_id)
    assert body["tokens_per_s"] == round(mean, 1)
    assert body["mfu_percent"] == mfu_percent(mean, gpus, peak)
    assert body["attempts"][0]["reports"] == 2 and body["attempts"][0]["tokens"] == 1228800


@pytest.mark.parametrize("failure", ["workload answers 500", "port refuses", "empty body", "not the format",
                                     "pod gone"])
def test_a_failed_scrape_keeps_the_previous_figures(live_clusters, teammate, failure):
    world = live_clusters
    attempt, (rank0, _) = running(world)
    emulator = world.emulator(attempt)
    emulator.serve_metrics(rank0, exposition(100, 51200.5, 409600, 2.5))
    collect_workload_metrics()
    before = efficiency(teammate.client, attempt.job_id)
    stored = WorkloadMetrics.objects.get(attempt_id=attempt.pk)

    if failure == "workload answers 500":
        emulator.serve_metrics(rank0, exposition(200, 1.0, 1, 1.0), status_code=500)
    elif failure == "port refuses":
        emulator.stop_serving(rank0)
    elif failure == "empty body":
        emulator.serve_metrics(rank0, "")
    elif failure == "not the format":
        emulator.serve_metrics(rank0, "<html><body>502 Bad Gateway</body></html>")
    else:
        emulator.delete_pod(rank0)
    assert collect_workload_metrics() == {"collected": 1, "unreachable": 0}

    after = efficiency(teammate.client, attempt.job_id)
    assert after == before
    assert after["tokens_per_s"] == 51200.5 and after["attempts"][0]["last"]["step"] == 100
    assert WorkloadMetrics.objects.get(attempt_id=attempt.pk).updated_at == stored.updated_at  # nothing written


def test_a_failed_scrape_falls_back_to_the_log(live_clusters, teammate):
    world = live_clusters
    attempt, (rank0, _) = running(world)
    emulator = world.emulator(attempt)
    emulator.stop_serving(rank0)
    emulator.write_log(rank0, "config flops_per_token=43200000000\nstep=50 tokens_per_s=40000.0 loss=3.0\n")
    collect_workload_metrics()
    body = efficiency(teammate.client, attempt.job_id)
    assert body["tokens_per_s"] == 40000.0 and body["attempts"][0]["source"] == "log"


def test_the_collection_before_a_preempted_attempts_deletion_takes_its_last_exposition(live_clusters):
    world = live_clusters
    attempt, (rank0, _) = running(world)
    emulator = world.emulator(attempt)
    emulator.serve_metrics(rank0, exposition(100, 51200.5, 409600, 2.5))
    collect_workload_metrics()
    emulator.serve_metrics(rank0, exposition(250, 58000.0, 1024000, 2.1))  # served after the last collection

    job = Job.objects.get(pk=attempt.job_id)
    preempt_attempt(job, attempt, reason="a higher-priority job needs the GPUs")
    delete_ended_attempt(attempt.pk)
    assert emulator.objects("Job", attempt.pk) == []  # its objects, and the pod that served, are gone

    stats = WorkloadMetrics.objects.get(attempt_id=attempt.pk).stats
    assert stats["last"]["step"] == 250 and stats["last"]["tokens_per_s"] == 58000.0
    assert stats["reports"] == 2


def test_the_emulated_pod_proxy_answers_as_an_api_server(live_clusters):
    world = live_clusters
    attempt, (rank0, rank1) = running(world)
    emulator = world.emulator(attempt)
    client = client_for(attempt.cluster)
    proxy = client.core.connect_get_namespaced_pod_proxy_with_path

    def get(name: str, path: str = "metrics"):
        try:
            answer = client.call(proxy, name, "cp-alpha", path, _preload_content=False)
        except ApiError as exc:
            return exc.status, exc.reason
        return answer.status, answer.data.decode()

    emulator.serve_metrics(rank0, "workload_step 7\n")
    assert get(f"{rank0}:9464") == (200, "workload_step 7\n")
    assert get(rank0) == (503, "ServiceUnavailable")  # no port: the first declared one, rendezvous: not serving
    assert get(f"http:{rank0}:9464") == (200, "workload_step 7\n")
    assert get(f"{rank0}:9464", "other")[0] == 404  # the workload's own 404
    assert get(f"{rank0}:8080") == (503, "ServiceUnavailable")  # nothing listens there
    assert get("job-999-1-0:9464") == (404, "NotFound")
    assert get(f"{rank1}:9464") == (503, "ServiceUnavailable")  # running, not serving
    emulator.finish_pod(rank0, 0)
    assert get(f"{rank0}:9464") == (503, "ServiceUnavailable")  # not running
