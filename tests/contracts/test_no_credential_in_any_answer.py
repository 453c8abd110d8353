"""No stored credential of a cluster appears in any answer, page or log line (docs/adr/0030-secrets.md).

Class of failure: a credential the platform stores encrypted is shown again: by a serializer field, a template, an
admin form, an error message that quotes a URL with its ``user:password@``, or a log line of a pass that used it.
Invariant: with distinctive canary strings planted as every credential of one cluster (its API token, CA bundle,
kubeconfig, and the user and password of its Prometheus URL), none of them appears in any GET answer of the API
(every read route of ``routes.py``, as staff and as the team's admin), in the UI's pages that show the cluster,
its jobs or the fleet, in the Django admin's pages of the cluster, or in any log record emitted while reconcile,
node pool sync, node health, utilization collection, the ledger check and workload metrics run against it (with
its Prometheus answering, then failing, and its API server answering, then refusing the credential).

The cluster answers: its kubeconfig (the canary one) points at an emulated API server (``tests/support/kubernetes``),
and its Prometheus is a small HTTP server that answers an empty result only to the canary basic auth, so the test
also shows the credentials were used.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from jobs import tasks as job_tasks
from jobs.lifecycle import dispatch
from jobs.models import Job
from jobs.scheduling.passes import try_admit
from runners import tasks as runner_tasks
from tests.support.clusters import H100_LABEL
from tests.support.kubernetes import ClusterEmulator, Fault
from tests.support.personas import signed_in

from .routes import ROUTES, world

TOKEN = "canary-api-token-6b1e0f"
CA = "-----BEGIN CERTIFICATE-----\ncanary-ca-bundle-93d7a2\n-----END CERTIFICATE-----\n"
KUBECONFIG_TOKEN = "canary-kubeconfig-token-c40f18"
KUBECONFIG_MARK = "canary-kubeconfig-comment-5a2e77"
PROMETHEUS_USER, PROMETHEUS_PASSWORD = "canary-prom-user-1d9c", "canary-prom-password-e83b5f"
#: Every distinctive string planted; none may appear anywhere, alone or in a larger string.
CANARIES = ("canary-api-token-6b1e0f", "canary-ca-bundle-93d7a2", KUBECONFIG_TOKEN, KUBECONFIG_MARK,
            PROMETHEUS_USER, PROMETHEUS_PASSWORD)
#: The kubeconfig token also appears base64-encoded in nothing we send; look for that form too.
ENCODED = tuple(base64.b64encode(c.encode()).decode() for c in CANARIES)


def leaks(text: str) -> list[str]:
    """The canaries (clear or base64) found in ``text``."""
    return [c for c in CANARIES + ENCODED if c in text]


def kubeconfig(server: str) -> str:
    return (f"# {KUBECONFIG_MARK}\napiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: '{server}'}}}}]\n"
            f"users: [{{name: u, user: {{token: {KUBECONFIG_TOKEN}}}}}]\n"
            f"contexts: [{{name: c, context: {{cluster: k, user: u}}}}]\n")


class Prometheus(BaseHTTPRequestHandler):
    """Answers ``/api/v1/query*`` with an empty result to the canary basic auth, 401 to any other; 400 to all while
    ``failing``. ``auths`` counts the requests that carried the canary credentials."""

    failing = False
    auths = 0
    expected = "Basic " + base64.b64encode(f"{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}".encode()).decode()

    def do_GET(self):  # noqa: N802 (http.server's name)
        if type(self).failing:  # an answer the client does not retry (a 5xx is retried with backoff)
            return self._answer(400, {"status": "error", "errorType": "bad_data", "error": "refused"})
        if self.headers.get("Authorization") != self.expected:
            return self._answer(401, {"status": "error", "error": "unauthorized"})
        type(self).auths += 1
        kind = "matrix" if "query_range" in self.path else "vector"
        return self._answer(200, {"status": "success", "data": {"resultType": kind, "result": []}})

    do_POST = do_GET  # noqa: N815

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Prometheus)
    Prometheus.failing, Prometheus.auths = False, 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def planted(lookups, aws_cluster, alpha_objects, prometheus, settings):
    """aws-use1 (the cluster behind the API's cluster and node pool routes) with every credential a canary, its
    kubeconfig pointed at an emulated API server with its two 8-GPU nodes, and alpha's job running there."""
    settings.K8S_CONNECT_TIMEOUT_SECONDS = settings.K8S_READ_TIMEOUT_SECONDS = 1.0
    settings.K8S_IMAGE_PULL_GRACE_SECONDS = 0
    emulator = ClusterEmulator("aws-use1")
    emulator.start()
    try:
        for i in (1, 2):
            emulator.add_node(f"ip-10-0-0-{i}", 8, {"nvidia.com/gpu.product": H100_LABEL})
        cluster = aws_cluster["cluster"]
        cluster.api_endpoint, cluster.api_token, cluster.ca_cert = emulator.url, TOKEN, CA
        cluster.kubeconfig = kubeconfig(emulator.url)
        cluster.prometheus_url = f"http://{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}@{prometheus}/"
        cluster.save()
        job = alpha_objects["job"]
        assert try_admit(job.pk) == "admitted", Job.objects.get(pk=job.pk).queue_info
        assert dispatch(Job.objects.get(pk=job.pk).current_attempt_id) == "dispatched"
        yield {"cluster": cluster, "job": Job.objects.get(pk=job.pk), "emulator": emulator}
    finally:
        emulator.stop()


@pytest.fixture
def lookups(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100, redis_broker):
    return world(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100)


def passes(prometheus_failing: bool) -> None:
    """Every periodic pass that uses a cluster's credentials, once."""
    from costs import tasks as cost_tasks

    Prometheus.failing = prometheus_failing
    job_tasks.reconcile_all()
    runner_tasks.sync_node_pools()
    runner_tasks.check_node_health()
    cost_tasks.collect_utilization()
    cost_tasks.check_ledger()
    job_tasks.collect_workload_metrics()


def test_no_log_record_of_a_pass_over_the_cluster_shows_a_credential(planted, caplog):
    caplog.set_level(logging.DEBUG)
    passes(prometheus_failing=False)
    assert Prometheus.auths > 0  # the Prometheus credentials were used
    assert planted["emulator"].pods(planted["job"].current_attempt_id)  # the kubeconfig was used
    passes(prometheus_failing=True)
    planted["emulator"].inject(Fault(401, count=None))  # the API server refuses the credential: every pass fails
    passes(prometheus_failing=False)
    assert any("refuses the credential" in r.getMessage() or "401" in r.getMessage() for r in caplog.records)
    records = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    assert caplog.records and leaks(caplog.text + records) == []


@pytest.mark.parametrize("persona", ["staff", "owner"])
def test_no_api_answer_shows_a_credential(planted, lookups, persona, request):
    client = request.getfixturevalue(persona).client
    seen = 0
    for route in ROUTES:
        if route.writes or not route.served:
            continue
        url = route.url(lookups.get(route.prefix)) if route.detail else route.template
        answer = client.get(url)
        body = answer.content.decode() if not getattr(answer, "streaming", False) else \
            b"".join(answer.streaming_content).decode()
        assert answer.status_code < 500, (url, body[:300])
        assert leaks(body) == [], url
        seen += answer.status_code == 200
    assert seen >= len({r.prefix for r in ROUTES})  # the answers are real ones, not refusals


@pytest.mark.parametrize("persona", ["staff", "owner"])
def test_no_page_that_shows_the_cluster_or_its_jobs_shows_a_credential(planted, persona, request):
    client = signed_in(request.getfixturevalue(persona))
    job = planted["job"]
    for url in ["/", "/clusters/", "/nodes/", "/capacity/", "/utilization/", "/queue/", "/jobs/", f"/jobs/{job.pk}/",
                f"/jobs/{job.pk}/status/",
                f"/jobs/{job.pk}/logs/", "/costs/", "/costs.csv", "/teams/alpha/"]:
        answer = client.get(url)
        assert answer.status_code == 200, url
        body = answer.content.decode() if not getattr(answer, "streaming", False) else \
            b"".join(answer.streaming_content).decode()
        assert leaks(body) == [], url
    assert "aws-use1" in client.get("/clusters/").content.decode()


def test_no_admin_page_of_the_cluster_shows_a_credential(planted):
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-root"))
    pk = planted["cluster"].pk
    for url in ["/admin/runners/cluster/", f"/admin/runners/cluster/{pk}/change/",
                f"/admin/runners/cluster/{pk}/history/", f"/admin/runners/cluster/{pk}/delete/",
                "/admin/runners/nodepool/"]:
        answer = client.get(url)
        assert answer.status_code == 200, url
        assert leaks(answer.content.decode()) == [], url


def test_no_audit_record_of_a_credential_change_shows_the_credential(planted, staff):
    """Staff rotate every credential of the cluster through the API and the Django admin; the audit trail says
    that they changed, and neither its API, its page, nor its admin pages show the old or the new values."""
    pk = planted["cluster"].pk
    rotated = {"api_token": f"{TOKEN}-rotated", "ca_cert": CA.replace("bundle", "bundle-rotated"),
               "kubeconfig": kubeconfig("https://127.0.0.1:1").replace(KUBECONFIG_MARK, f"{KUBECONFIG_MARK}-2"),
               "prometheus_url": f"http://{PROMETHEUS_USER}:{PROMETHEUS_PASSWORD}-2@127.0.0.1:1/"}
    answer = staff.client.patch(f"/api/v1/clusters/{pk}/", rotated, format="json",
                                headers={"X-Audit-Reason": "rotation"})
    assert answer.status_code == 200, answer.content[:300]
    root = Client()
    root.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-root"))
    form = root.get(f"/admin/runners/cluster/{pk}/change/").context["adminform"].form
    data = {name: ("" if value is None else value) for name, value in form.initial.items()
            if name in form.fields and not isinstance(value, (list, dict))}
    data.update({"api_token": TOKEN, "emulated": "", "audit_reason": "rotated back",
                 "node_pools-TOTAL_FORMS": "0", "node_pools-INITIAL_FORMS": "0",
                 "events-TOTAL_FORMS": "0", "events-INITIAL_FORMS": "0"})
    saved = root.post(f"/admin/runners/cluster/{pk}/change/", data)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    from quotas.models import AuditRecord

    records = list(AuditRecord.objects.filter(object_type="cluster", object_id=pk).order_by("id"))
    assert [(r.actor_name, r.reason) for r in records] == [(staff.user.username, "rotation"), ("root", "rotated back")]
    assert {name: records[0].after[name] for name in ("api_token", "ca_cert", "kubeconfig", "prometheus_auth")} == \
        dict.fromkeys(("api_token", "ca_cert", "kubeconfig", "prometheus_auth"), "credential changed")
    assert records[1].after["api_token"] == "credential changed" and records[1].after["kubeconfig"] == "set"
    for client, url in [(staff.client, "/api/v1/audit/"), (staff.client, f"/api/v1/audit/{records[0].pk}/"),
                        (signed_in(staff), "/audit/"), (signed_in(staff), "/audit/?object_type=cluster"),
                        (root, "/admin/quotas/auditrecord/"), (root, f"/admin/quotas/auditrecord/{records[0].pk}/change/"),
                        (root, f"/admin/quotas/auditrecord/{records[1].pk}/change/")]:
        answer = client.get(url)
        assert answer.status_code == 200, url
        assert leaks(answer.content.decode()) == [], url
    assert "credential changed" in signed_in(staff).get("/audit/").content.decode()
