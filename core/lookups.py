"""Per-process, short-lived caches of the rows every API request reads: token, membership, accelerator, priorities.

A submission reads the same few rows on every request (the caller's token
and user, their membership of the team, the accelerator and its largest node
pool, the priority classes). Reading them from PostgreSQL each time costs a
round trip and an ORM build per row, which on a 2-core machine is most of a
request. These caches keep the answers for ``settings.LOOKUP_CACHE_SECONDS``
(default 5 s; 0 turns every cache off).

Staleness is bounded and explicit, the way Kubernetes' own API server caches
authentication results (``--authentication-token-webhook-cache-ttl``, 2 min
by default):

* in the process that makes the change, a ``post_save`` / ``post_delete`` of
  any model a cache depends on empties that cache at once and again when the
  transaction commits (another thread may have re-read the old row meanwhile),
  and an answer loaded while a clear happened is not kept; code that changes
  such rows with a queryset ``update()`` calls :func:`changed`;
* in other processes (other gunicorn workers), a revoked token, a removed
  membership or a deactivated user stays usable for at most the TTL.

Only positive answers are cached: an unknown token or team is read again on
every request. None of this touches admission itself: quotas and budgets are
always checked by the scheduler under row locks (``jobs.scheduling.apply``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from cachetools import TTLCache
from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

_MISSING = object()
_ALL: list = []  # every LookupCache, and the other caches given to ``register``
_BY_MODEL: dict[type, list[LookupCache]] = {}


def clear_all() -> None:
    """Empty every LookupCache of this process, and every cache given to :func:`register` (tests call it between
    cases: a rollback sends no signal)."""
    for cache in list(_ALL):
        cache.clear()


def register(cache):
    """Have :func:`clear_all` empty ``cache`` too: any per-process cache with a ``clear()`` method that is not a
    LookupCache (one validated by row versions rather than a TTL, say). Returns ``cache``."""
    _ALL.append(cache)
    return cache


class LookupCache:
    """A thread-safe read-through cache with a time to live, emptied when one of its models changes.

    ``name`` labels it; ``maxsize`` bounds its entries (least recently used
    go first); ``timer`` gives the time in seconds (monotonic by default). ``get(key, load)`` returns the cached value of ``key`` or
    calls ``load()`` (no arguments) and caches its result unless that is
    None. The TTL is read from ``settings.LOOKUP_CACHE_SECONDS`` (seconds)
    on each call, so ``override_settings`` works; 0 bypasses the cache.
    """

    def __init__(self, name: str, maxsize: int = 4096, timer: Callable[[], float] = time.monotonic):
        self.name = name
        self.maxsize = maxsize
        self.timer = timer
        self._lock = threading.Lock()
        self._ttl: float | None = None
        self._cache: TTLCache | None = None
        self._generation = 0  # bumped by every clear: a load that saw an older one must not store its answer
        _ALL.append(self)

    def _current(self) -> TTLCache | None:
        ttl = float(getattr(settings, "LOOKUP_CACHE_SECONDS", 0))
        if ttl <= 0:
            return None
        if self._cache is None or self._ttl != ttl:
            self._cache, self._ttl = TTLCache(self.maxsize, ttl, timer=self.timer), ttl
        return self._cache

    def get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The value of ``key``: cached if fresh, else ``load()`` (cached when not None)."""
        with self._lock:
            cache = self._current()
            value = cache.get(key, _MISSING) if cache is not None else _MISSING
            generation = self._generation
        if value is not _MISSING:
            return value
        value = load()
        if value is not None and cache is not None:
            with self._lock:
                # A clear while ``load`` ran means the row may have changed after it was read: do not keep it.
                if self._cache is cache and self._generation == generation:
                    cache[key] = value
        return value

    def clear(self, *args, **kwargs) -> None:
        """Forget every entry (also a signal receiver: extra arguments are ignored)."""
        with self._lock:
            self._generation += 1
            if self._cache is not None:
                self._cache.clear()

    def changed(self, *args, **kwargs) -> None:
        """A row this cache depends on changed: clear now, and again when the current transaction commits.

        The second clear drops what another thread may have read, from the
        still-committed old row, while the change was not yet committed.
        """
        self.clear()
        transaction.on_commit(self.clear)

    def invalidate_on(self, *models) -> LookupCache:
        """Empty this cache whenever an instance of one of ``models`` is saved or deleted (now and at commit).

        Queryset ``update()`` and ``delete()`` of many rows send no signal: code
        that changes these models that way calls :func:`changed` itself.
        Returns self.
        """
        for model in models:
            _BY_MODEL.setdefault(model, []).append(self)
            post_save.connect(self.changed, sender=model, weak=False, dispatch_uid=f"lookup-{self.name}-{model}-save")
            post_delete.connect(self.changed, sender=model, weak=False,
                                dispatch_uid=f"lookup-{self.name}-{model}-del")
        return self


def changed(model) -> None:
    """Rows of ``model`` changed without a signal (a queryset ``update()``): clear the caches that depend on it."""
    for cache in _BY_MODEL.get(model, ()):
        cache.changed()
