"""Production settings cannot be started with secrets anyone can derive (docs/adr/0030-secrets.md).

Class of failure: a production install runs on the SECRET_KEY published in the repository, so its sessions can be
forged and the key of the cluster credentials derived from it. Invariant: with ``CONTROLPLANE_ENV=production`` the
settings refuse to load (ImproperlyConfigured, saying how to set the value) without a real SECRET_KEY, without an
explicit encryption key, or with DEBUG on; with them, ``manage.py check --deploy`` reports nothing; a checkout
without configuration (the demo, the tests) still starts.

Each case starts ``manage.py`` in a subprocess with exactly the environment under test.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from controlplane import deployment

ROOT = Path(__file__).resolve().parents[2]
#: What a production environment sets besides the secrets (platform/kubernetes/base/configmap.yaml).
PRODUCTION = {"CONTROLPLANE_ENV": "production", "ALLOWED_HOSTS": "ml.example.com", "DEBUG": "false"}


def manage(tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """``manage.py args`` with the caller's PATH, the test database and broker, and ``env``; nothing else."""
    base = {k: os.environ[k] for k in ("PATH", "DATABASE_URL", "CELERY_BROKER_URL") if k in os.environ}
    base["CONTROLPLANE_VAR_DIR"] = str(tmp_path / "var")
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def strong_secrets() -> dict:
    return {"SECRET_KEY": secrets.token_urlsafe(50), "FIELD_ENCRYPTION_KEYS": Fernet.generate_key().decode()}


def test_check_deploy_reports_nothing_on_the_production_settings(tmp_path):
    answer = manage(tmp_path, {**PRODUCTION, **strong_secrets()}, "check", "--deploy", "--fail-level", "WARNING")
    assert answer.returncode == 0, answer.stderr
    assert "System check identified no issues" in answer.stdout, answer.stdout + answer.stderr
    assert "WARNING" not in answer.stderr + answer.stdout


def test_check_deploy_reports_nothing_with_secrets_read_from_files(tmp_path):
    values = strong_secrets()
    (tmp_path / "secret_key").write_text(values["SECRET_KEY"] + "\n")
    (tmp_path / "keys").write_text(f"{Fernet.generate_key().decode()}\n{values['FIELD_ENCRYPTION_KEYS']}\n")
    env = {**PRODUCTION, "SECRET_KEY_FILE": str(tmp_path / "secret_key"),
           "FIELD_ENCRYPTION_KEYS_FILE": str(tmp_path / "keys")}
    answer = manage(tmp_path, env, "check", "--deploy", "--fail-level", "WARNING")
    assert answer.returncode == 0 and "no issues" in answer.stdout, answer.stderr


@pytest.mark.parametrize("case", ["no-secret-key", "development-key", "placeholder", "no-encryption-key",
                                  "debug"])
def test_production_refuses_to_start_without_its_secrets(tmp_path, case):
    env = {**PRODUCTION, **strong_secrets()}
    expected = "SECRET_KEY"
    if case == "no-secret-key":
        env.pop("SECRET_KEY")
    elif case == "development-key":
        env["SECRET_KEY"] = deployment.DEVELOPMENT_SECRET_KEY
    elif case == "placeholder":
        env["SECRET_KEY"] = "REPLACE-ME-django-secret-key"
    elif case == "no-encryption-key":
        env.pop("FIELD_ENCRYPTION_KEYS")
        expected = "FIELD_ENCRYPTION_KEYS"
    else:
        env["DEBUG"] = "true"
        expected = "DEBUG"
    answer = manage(tmp_path, env, "check")
    assert answer.returncode != 0
    last = answer.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured:") and expected in last, answer.stderr
    assert "Set " in last or "unset" in last  # it says what to do


def test_a_checkout_without_configuration_starts_as_development(tmp_path):
    answer = manage(tmp_path, {}, "check")
    assert answer.returncode == 0, answer.stderr


@pytest.mark.parametrize("value", ["prod", "Production ", "staging"])
def test_an_unknown_environment_name_is_refused_not_taken_for_development(value):
    if value.strip().lower() == "production":
        assert deployment.environment(value) == "production"
        return
    with pytest.raises(ImproperlyConfigured, match="CONTROLPLANE_ENV"):
        deployment.environment(value)


@pytest.mark.parametrize("weak", ["x" * 60, "django-insecure-" + secrets.token_urlsafe(50), "short-but-random-9f"])
def test_production_refuses_a_weak_secret_key(weak):
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        deployment.secret_key(weak, "production")
    assert deployment.secret_key(weak, "development") == weak
    assert deployment.secret_key("", "development") == deployment.DEVELOPMENT_SECRET_KEY


def test_encryption_keys_are_checked_everywhere_and_required_in_production():
    new, old = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    assert deployment.encryption_keys([new], old, "production") == [new, old]
    assert deployment.encryption_keys([new, old], old, "production") == [new, old]
    assert deployment.encryption_keys([], "", "development") == []
    for bad in (["REPLACE-ME-fernet-key-urlsafe-base64-32-bytes"], [new, new]):
        with pytest.raises(ImproperlyConfigured, match="FIELD_ENCRYPTION_KEYS"):
            deployment.encryption_keys(bad, "", "development")
    with pytest.raises(ImproperlyConfigured, match="never|FIELD_ENCRYPTION_KEYS"):
        deployment.encryption_keys([], "", "production")
