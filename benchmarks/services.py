"""Checks that a benchmark's services and tools are there, and a message that says what is missing."""

from __future__ import annotations

import json
import shutil
import sys


def postgres_missing(url: str) -> str | None:
    """None when PostgreSQL at ``url`` (``postgres://user@host:port/db``) accepts a connection to its ``postgres``
    database (the benchmarks create their own); otherwise what is missing."""
    import psycopg

    admin = url.rsplit("/", 1)[0] + "/postgres"
    try:
        psycopg.connect(admin.replace("postgres://", "postgresql://"), connect_timeout=5).close()
    except psycopg.Error as exc:
        return (f"PostgreSQL at {admin} ({str(exc).strip().splitlines()[0]}): start a server there "
                f"(Debian: apt-get install postgresql) or set BENCH_DATABASE_URL")
    return None


def redis_missing(url: str) -> str | None:
    """None when Redis at ``url`` answers PING; otherwise what is missing."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=5).ping()
    except redis.RedisError as exc:
        return f"Redis at {url} ({exc}): start one there (Debian: apt-get install redis-server) or set BENCH_BROKER_URL"
    return None


def commands_missing(commands: dict[str, str]) -> list[str]:
    """``commands``: {executable: Debian package}; one message per executable not on PATH."""
    return [f"{cmd} not on PATH (Debian: apt-get install {package})"
            for cmd, package in commands.items() if shutil.which(cmd) is None]


def require(benchmark: str, missing: list[str | None]) -> None:
    """Exit with status 3 when anything is missing: each message on stderr, then one JSON line
    ``{"benchmark": ..., "missing": [...]}`` (what ``make bench`` records for it)."""
    missing = [m for m in missing if m]
    if not missing:
        return
    for message in missing:
        print(f"{benchmark}: missing {message}", file=sys.stderr)
    print(json.dumps({"benchmark": benchmark, "missing": missing}))
    sys.exit(3)
