"""Portable raw SQL for the few hot reads where the ORM's query building costs more than the query itself.

Building and compiling a small aggregate queryset costs 1.5-2.5 ms of CPU on
a 2-core machine, ten times the database's own work for an indexed read of a
few dozen rows (``benchmarks/ledger_scale.py``, budget status). The reads
that admission and budget status repeat per team use plain SQL through
these helpers instead: parameters are adapted by the connection's own
operations (so datetimes compare as the ORM stores them on PostgreSQL and
SQLite alike) and results converted back as the ORM would.
"""

from __future__ import annotations

import datetime as dt
import decimal
from decimal import Decimal

from django.db import connection

_FLOAT_CONTEXT = decimal.Context(prec=15)


def placeholders(count: int) -> str:
    """``%s, %s, ...`` for an ``IN (...)`` of ``count`` values (at least one; raises ValueError for 0)."""
    if count < 1:
        raise ValueError("an IN list needs at least one value")
    return ", ".join(["%s"] * count)


def param(value):
    """``value`` as the connection stores it: aware datetimes and dates through ``connection.ops``, else as is."""
    if isinstance(value, dt.datetime):
        return connection.ops.adapt_datetimefield_value(value)
    if isinstance(value, dt.date):
        return connection.ops.adapt_datefield_value(value)
    return value


def fetch(sql: str, params) -> list[tuple]:
    """Run ``sql`` (``%s`` placeholders) with ``params`` adapted by ``param``; all rows as tuples."""
    with connection.cursor() as cursor:
        cursor.execute(sql, [param(p) for p in params])
        return cursor.fetchall()


def as_decimal(value, places: int) -> Decimal | None:
    """A numeric column or aggregate as Decimal: PostgreSQL's numeric as is, SQLite's int or float as Django's
    SQLite backend converts them (15 significant digits, quantized to ``places``); None stays None."""
    if value is None or isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return _FLOAT_CONTEXT.create_decimal_from_float(value).quantize(Decimal(1).scaleb(-places))
    return Decimal(value)


def as_date(value) -> dt.date:
    """A date column: PostgreSQL's date as is, SQLite's ISO text parsed."""
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
