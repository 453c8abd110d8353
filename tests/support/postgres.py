"""A private PostgreSQL server for tests that restart it, stop it or fill its connection slots.

Started with ``initdb`` and ``pg_ctl`` (``/usr/lib/postgresql/15/bin``) in a temporary directory on a free
port, trust authentication, never the shared server on 5432. As root, the server runs as the ``postgres``
user (PostgreSQL refuses to run as root). ``app_database`` points the app's default connection at one for a
block.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
from django.db import connection

from tests.support.net import free_port

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))


@dataclass
class PrivatePostgres:
    """A running private server: ``host``/``port``, superuser ``postgres``, database ``postgres``."""

    datadir: Path
    port: int
    host: str = "127.0.0.1"
    max_connections: int = 10

    def _pg_ctl(self, *args: str) -> None:
        command = [str(PG_BIN / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "30", *args]
        subprocess.run(_as_postgres(command), check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c max_connections={self.max_connections} "
                f"-c superuser_reserved_connections=0 -c fsync=off "
                f"-c unix_socket_directories={self.datadir}")
        self._pg_ctl("-o", opts, "-l", str(self.datadir / "server.log"), "start")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def restart(self) -> None:
        """Stop (fast: every connection is cut) and start again on the same port."""
        self.stop()
        self.start()

    def connect(self) -> psycopg.Connection:
        """A plain psycopg connection (autocommit) to the ``postgres`` database."""
        return psycopg.connect(host=self.host, port=self.port, user="postgres", dbname="postgres", autocommit=True)

    def settings_dict(self) -> dict:
        """The Django ``DATABASES`` entry's connection fields for this server."""
        return {"HOST": self.host, "PORT": str(self.port), "USER": "postgres", "PASSWORD": "", "NAME": "postgres"}


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def private_postgres(max_connections: int = 10):
    """Yield a started ``PrivatePostgres``; stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="pg-private-"))
    datadir = root / "data"
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(datadir), "-U", "postgres", "-A", "trust",
                                     "--no-sync", "-E", "UTF8"]), check=True, capture_output=True, timeout=120)
        server = PrivatePostgres(datadir=datadir, port=free_port(), max_connections=max_connections)
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def app_database(django_db_blocker, fields: dict):
    """The app's default connection pointed at ``fields`` (host, port, ...) for the block, then restored."""
    with django_db_blocker.unblock():
        saved = dict(connection.settings_dict)
        connection.close()
        connection.settings_dict.update(fields)
        try:
            yield
        finally:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)
