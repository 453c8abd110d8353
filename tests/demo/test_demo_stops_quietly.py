"""``make demo`` is stopped the README's way, with Ctrl-C: the demo stops its processes and ends with exit status 0
(make then reports no "Error 130"), saying it was stopped."""

import os
import signal
import subprocess
import sys
import time

import redis

from tests.support.net import free_port

from .test_demo_end_to_end import ROOT, _fresh_database


def test_ctrl_c_stops_the_demo_with_exit_status_0(tmp_path):
    base_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane")
    db_url = _fresh_database(base_url, f"{base_url.rsplit('/', 1)[1]}_demo_stop")
    broker = os.environ.get("CELERY_BROKER_URL") or "redis://127.0.0.1:6379/14"
    redis.Redis.from_url(broker).flushdb()
    env = {**os.environ, "DATABASE_URL": db_url, "CELERY_BROKER_URL": broker, "CONTROLPLANE_VAR_DIR": str(tmp_path),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "manage.py", "demo", "--steps", "40", "--port", str(free_port())],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:  # the platform is up once it submits
            seen.append(line)
            if line.startswith("Submitted the pipeline") or time.monotonic() > deadline:
                break
        assert any(line.startswith("Submitted the pipeline") for line in seen), "".join(seen)[-4000:]
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends (make passes it on to the demo)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(seen) + rest
    assert proc.returncode == 0, out[-4000:]
    assert "Stopped by Ctrl-C." in out and "Stopping the platform..." in out
    assert "Traceback" not in out
