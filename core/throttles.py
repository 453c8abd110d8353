"""Rate limits counted in Django's cache: one scope's rate per identity (a user, a team, a client address).

The cache is Redis when ``CACHE_URL`` is set (every web pod counts in the same place), else each process's own
memory. Rates are DRF's ``"N/period"`` strings of ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``; a scope whose rate
is ``None`` is not limited.
"""

from __future__ import annotations

import math

from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle


def client_address(request) -> str:
    """The client's IP address: ``REMOTE_ADDR``, or the address ``NUM_PROXIES`` trusted proxies put in
    ``X-Forwarded-For`` (DRF's rule, ``BaseThrottle.get_ident``). ``request``: a Django or DRF request."""
    return BaseThrottle().get_ident(request) or "unknown"


class RateLimit(SimpleRateThrottle):
    """At most N events per period for each identity in one scope (DRF's sliding window of event times).

    ``scope``: a key of ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (``"submit_user"``). Raises
    ImproperlyConfigured (DRF) when the scope has no rate entry. Checking and counting are apart, so a caller may
    count failures only (``record``) and refuse while they reach the rate (``retry_after``); ``take`` does both.
    Two processes counting the same identity at once may both pass at the limit (the cache is read, then
    written): the rate is a bound to within the concurrent requests, as DRF's throttles are.
    """

    def __init__(self, scope: str):
        self.scope = scope
        self.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES  # read now: settings may change (tests)
        super().__init__()

    def get_cache_key(self, request, view):  # DRF's hook; identities are given explicitly here
        raise NotImplementedError("RateLimit counts explicit identities: use retry_after, record or take")

    def _history(self, ident) -> list[float]:
        self.key = self.cache_format % {"scope": self.scope, "ident": ident}
        self.now = self.timer()
        self.history = [t for t in self.cache.get(self.key, []) if t > self.now - self.duration]
        return self.history

    def retry_after(self, ident) -> int | None:
        """Whole seconds until ``ident`` may act again when its events in the last period reached the rate, else
        None (nothing is counted)."""
        if self.rate is None or len(self._history(ident)) < self.num_requests:
            return None
        return max(1, math.ceil(self.history[-1] + self.duration - self.now))

    def record(self, ident) -> None:
        """Count one event of ``ident`` now."""
        if self.rate is None:
            return
        self._history(ident).insert(0, self.now)
        self.cache.set(self.key, self.history[: self.num_requests], self.duration)

    def take(self, ident) -> int | None:
        """``retry_after(ident)``, counting the event when it is allowed (None)."""
        wait = self.retry_after(ident)
        if wait is None:
            self.record(ident)
        return wait
