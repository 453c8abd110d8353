"""The API's pagination: DRF's limit/offset with a cap on ``limit``.

Without ``max_limit`` a ``?limit=`` above PostgreSQL's bigint reaches the
database as ``LIMIT`` and fails there (a 500); a cap also bounds the page.
"""

from rest_framework.pagination import LimitOffsetPagination


class CappedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` above ``max_limit`` is served as ``max_limit`` rows (DRF's cutoff behaviour)."""

    max_limit = 1000
