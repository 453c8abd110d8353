"""What ``make demo`` does before and after the platform runs: its port check, its tokens, its cleanup."""

import socket

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from demo.run import seed_demo

pytestmark = pytest.mark.django_db


def test_a_busy_port_is_a_one_line_error_before_anything_starts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CommandError, match=rf"port {port} on 127.0.0.1 is in use .* make demo PORT="):
            call_command("demo", "--once", "--port", str(port))


def test_each_seed_revokes_the_previous_runs_demo_token(settings, tmp_path):
    settings.LOCAL_RUNNER_DIR = tmp_path / "runs"
    first = seed_demo()["ml-research"].token
    second = seed_demo()["ml-research"].token
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {first}")
    assert client.get("/api/v1/jobs/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert client.get("/api/v1/jobs/").status_code == 200


def test_a_cordon_left_by_an_earlier_run_is_lifted_and_said(settings, tmp_path):
    """A staff cordon on a node of the demo's local cluster outlives the demo; the next run would leave its 2-node
    training job never placeable until the timeout. The demo lifts it, audited with its reason, and says so; a
    node of another cluster keeps its cordon."""
    import io

    from demo.run import lift_cordons
    from quotas.models import AuditRecord
    from runners import health
    from runners.local.capacity import ensure_local_cluster
    from runners.models import Accelerator, Node
    from tests.support.factories import make_cluster

    settings.LOCAL_RUNNER_DIR = tmp_path / "runs"
    seed_demo()
    local = Node.objects.filter(cluster=ensure_local_cluster()).order_by("name")
    assert local.count() >= 2
    left = health.cordon(local[0], None, "reseating a GPU")
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", Accelerator.objects.get(name="H100-80GB"))
    other = Node.objects.create(cluster=cluster, node_pool=pool, name="ip-10-0-0-1",
                                gpus=8, cpu_milli=64_000, memory_mib=512 * 1024, cordoned=True,
                                seen_at=timezone.now())
    out = io.StringIO()
    assert lift_cordons(out) == [left.name]
    assert not Node.objects.get(pk=left.pk).cordoned and Node.objects.get(pk=other.pk).cordoned
    assert f"Node {left.name} was left cordoned" in out.getvalue()
    record = AuditRecord.objects.filter(object_type="node", object_id=left.pk).latest("at")
    assert (record.action, record.reason) == ("uncordoned", "the demo needs every node of its local cluster")
    assert lift_cordons(io.StringIO()) == []


def test_the_demo_links_notifications_to_its_own_web_server(settings, monkeypatch):
    """A webhook's link must be absolute to be followed from a chat tool: with no NOTIFY_BASE_URL configured, the
    demo's processes get its own address; a configured one is kept."""
    import os

    from demo.run import use_own_address_for_links

    monkeypatch.setenv("NOTIFY_BASE_URL", "")
    settings.NOTIFY_BASE_URL = ""
    assert use_own_address_for_links(8123) == "http://127.0.0.1:8123"
    assert (settings.NOTIFY_BASE_URL, os.environ["NOTIFY_BASE_URL"]) == ("http://127.0.0.1:8123",) * 2
    settings.NOTIFY_BASE_URL = "https://cp.example.com"
    assert use_own_address_for_links(8123) == "https://cp.example.com"
    assert os.environ["NOTIFY_BASE_URL"] == "https://cp.example.com"
