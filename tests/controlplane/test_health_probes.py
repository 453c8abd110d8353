"""The health probes: ``/healthz`` (the process is up) and ``/readyz`` (database and broker reachable, 503 naming
what failed)."""

from __future__ import annotations

from controlplane import views
from controlplane.celery import app as celery_app


def test_healthz_answers_ok(client):
    r = client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_readyz_checks_the_database_and_the_broker(db, client):
    r = client.get("/readyz")
    assert r.status_code == 200, r.content
    assert r.json() == {"status": "ok", "down": [], "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_answers_503_naming_an_unreachable_broker(db, client, monkeypatch):
    # Celery reads CELERY_BROKER_URL from the environment before its configuration.
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setattr(celery_app.conf, "broker_url", "redis://127.0.0.1:1/0")
    r = client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"] != "ok"
    assert body["down"] == ["broker"]
    assert r["Retry-After"] == "5"


def test_readyz_answers_503_naming_a_failed_database(db, client, monkeypatch):
    def broken():
        raise ConnectionError("database is down")

    monkeypatch.setitem(views.READINESS_CHECKS, "database", broken)
    r = client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["checks"]["database"] == "ConnectionError: database is down"
    assert r.json()["down"] == ["database"]


def test_readyz_never_shows_the_password_of_a_broker_url(db, client, monkeypatch):
    def broken():
        raise ConnectionError("cannot reach redis://celery:s3cret@redis.example:6379/0")

    monkeypatch.setitem(views.READINESS_CHECKS, "broker", broken)
    r = client.get("/readyz")
    assert r.status_code == 503
    assert r.json()["checks"]["broker"] == "ConnectionError: cannot reach redis://redis.example:6379/0"
    assert "s3cret" not in r.content.decode()
