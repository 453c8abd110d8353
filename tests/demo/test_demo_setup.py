"""What ``make demo`` does before and after the platform runs: its port check, its tokens, its cleanup."""

import socket

import pytest
from django.core.management import CommandError, call_command
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
