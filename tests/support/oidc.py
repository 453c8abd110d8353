"""A real OpenID Connect provider for the single sign-on tests: ``tests.support.oidc_provider`` (django-oauth-toolkit)
served by Django's ``runserver`` in a process of its own, on 127.0.0.1 and a free port, its SQLite database and
RSA signing key in a temporary directory. Nothing leaves the machine.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from .net import free_port, stop_process

REPO = Path(__file__).resolve().parents[2]
SETTINGS = "tests.support.oidc_provider.settings"
STARTUP_SECONDS = 60.0


@dataclass
class OidcProvider:
    """A running test provider: its ``issuer`` and discovery document, the control plane's client credentials at
    it, and its RSA signing key (PEM), so tests can sign tokens as the provider would."""

    data: Path
    process: subprocess.Popen
    issuer: str
    discovery: dict
    redirect_uri: str
    client_id: str
    client_secret: str
    signing_key_pem: bytes
    log: Path
    env: dict = field(repr=False, default_factory=dict)

    def control_plane_settings(self, name: str, group_map: dict) -> dict:
        """The control plane settings that point single sign-on at this provider, shown as ``name``, with
        ``group_map`` (``{group: (grant, ...)}``, as ``quotas.groupmap.parse_group_map`` returns)."""
        return {
            "OIDC_RP_CLIENT_ID": self.client_id,
            "OIDC_RP_CLIENT_SECRET": self.client_secret,
            "OIDC_OP_ISSUER": self.issuer,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": self.discovery["authorization_endpoint"],
            "OIDC_OP_TOKEN_ENDPOINT": self.discovery["token_endpoint"],
            "OIDC_OP_USER_ENDPOINT": self.discovery["userinfo_endpoint"],
            "OIDC_OP_JWKS_ENDPOINT": self.discovery["jwks_uri"],
            "OIDC_RP_SIGN_ALGO": "RS256",
            "OIDC_PROVIDER_NAME": name,
            "OIDC_GROUP_MAP": group_map,
        }

    def manage(self, *argv: str) -> None:
        """Run a management command of the provider (``provider_user ...``) in a process of its own."""
        done = subprocess.run(
            [sys.executable, "-m", "django", *argv], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr

    def set_user(self, username: str, password: str, groups: list[str], email: str = "") -> None:
        """Create or update the provider's user ``username`` with exactly ``groups``."""
        self.manage(
            "provider_user",
            username,
            "--password",
            password,
            "--email",
            email,
            *[arg for group in groups for arg in ("--group", group)],
        )

    def stop(self) -> None:
        stop_process(self.process)


def start_provider(data: Path, redirect_uri: str) -> OidcProvider:
    """Start a provider with its files under ``data`` whose one client (random id and secret) may redirect to
    ``redirect_uri``; returns when its discovery document answers. Raises ``RuntimeError`` with the provider's log
    when it does not answer within 60 seconds."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (data / "signing-key.pem").write_bytes(pem)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "OIDC_PROVIDER_DATA": str(data), "PYTHONPATH": str(REPO)}
    client_id, client_secret = f"control-plane-{secrets.token_hex(4)}", secrets.token_urlsafe(24)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "provider_setup",
            "--client-id",
            client_id,
            "--client-secret",
            client_secret,
            "--redirect-uri",
            redirect_uri,
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode:
        raise RuntimeError(f"provider_setup failed: {done.stderr}")
    port = free_port()
    log = data / "provider.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    issuer = f"http://127.0.0.1:{port}/o"
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            answer = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2)
            if answer.status_code == 200:
                break
        except requests.ConnectionError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the test provider did not start: {log.read_text()}")
        time.sleep(0.2)
    discovery = answer.json()
    assert discovery["issuer"] == issuer, discovery["issuer"]
    return OidcProvider(
        data=data,
        process=process,
        issuer=issuer,
        discovery=discovery,
        redirect_uri=redirect_uri,
        client_id=client_id,
        client_secret=client_secret,
        signing_key_pem=pem,
        log=log,
        env=env,
    )
