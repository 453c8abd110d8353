"""What ``cpctl`` prints: lines, JSON, rich tables, and the formats of times, durations, money and percentages.

Streams are looked up at call time (``click.echo``, ``sys.stdout``), so a
test runner that swaps them sees everything.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

UNBOUNDED_WIDTH = 1_000_000  # characters: a table piped to a file or a program is never wrapped


def out(text: str = "") -> None:
    """Print a line on stdout."""
    click.echo(text)


def err(text: str) -> None:
    """Print a line on stderr."""
    click.echo(text, err=True)


def print_json(data) -> None:
    """``data`` as indented JSON on stdout (non-ASCII characters as themselves)."""
    out(json.dumps(data, indent=2, ensure_ascii=False))


def _console(file, width: int | None = None) -> Console:
    """A rich console on ``file`` that prints text as given: no markup, emoji codes or highlighting."""
    return Console(file=file, width=width, markup=False, emoji=False, highlight=False)


def table(headers: list[str], rows: list[list], right: tuple[str, ...] = ()) -> None:
    """Print ``rows`` under ``headers`` as a rich table with columns two spaces apart (None shows as ``-``).

    Columns named in ``right`` align right. On a terminal the table fits its
    width (long cells wrap) and headers are bold; piped, it is plain text,
    one line per row, cells never wrapped, no trailing spaces, no colour codes.
    """
    grid = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style="bold")
    for header in headers:
        grid.add_column(header, justify="right" if header in right else "left")
    for row in rows:
        grid.add_row(*(Text("-" if value is None else str(value)) for value in row))
    console = _console(sys.stdout)
    if console.is_terminal:
        console.print(grid)
        return
    buffer = io.StringIO()
    _console(buffer, UNBOUNDED_WIDTH).print(grid)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))


def fields(pairs: list[tuple[str, str]]) -> None:
    """Print ``name  value`` lines, indented two spaces, the values aligned (``cpctl job``, ``cpctl report``)."""
    width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        out(f"  {name.ljust(width)}  {value}")


def parse_time(value: str | None) -> dt.datetime | None:
    """An API timestamp (ISO 8601, ``Z`` or an offset) as an aware datetime; None (or unreadable) stays None."""
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)  # Python 3.11 reads "Z"
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def when(value: str | None) -> str:
    """A timestamp as ``YYYY-MM-DD HH:MM:SS`` UTC, or ``-``."""
    parsed = parse_time(value)
    return parsed.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if parsed else "-"


def duration(seconds: float) -> str:
    """A short human duration of ``seconds``, in its largest whole unit: ``45s``, ``12m``, ``3h``, ``2d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def age(value: str | None, now: dt.datetime | None = None) -> str:
    """How long before ``now`` (default: the current UTC time) ``value`` (an API timestamp) was; ``-`` for none."""
    parsed = parse_time(value)
    if parsed is None:
        return "-"
    return duration(((now or dt.datetime.now(dt.timezone.utc)) - parsed).total_seconds())


def shown_amount(value) -> str:
    """A USD amount the API gives with more digits (a decimal string) as the server's pages show money: to cents,
    half to even; an amount above 0 that cents would read as 0.00 to two significant digits (``"0.000125"`` ->
    ``0.00012``), never a zero for a cost that is not."""
    exact = Decimal(str(value))
    cents = exact.quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    return str(cents) if cents or not exact else format(Decimal(format(exact, ".2g")).normalize(), "f")


def usd(value) -> str:
    """An API money string (``"12.35"``, USD) as ``$12.35``; None as ``-``."""
    return "-" if value is None else f"${value}"


def rounding_gap(difference) -> str:
    """What a table's rows, each rounded to cents once, are off its total by, as words: ``difference`` is the API's
    ``rounding_difference_usd`` (total minus the rows' sum, a cents string): ``"0.01"`` -> ``miss the total by
    $0.01``, ``"-0.01"`` -> ``exceed the total by $0.01`` (never a ``$-0.01``)."""
    amount = Decimal(str(difference))
    return f"{'exceed' if amount < 0 else 'miss'} the total by ${abs(amount)}"


def money(figures: dict, key: str = "cost_usd", prefix: str = "") -> str:
    """A money figure of an API answer with the hours it leaves out for want of a price beside it: ``$67.20``,
    ``$67.20 + 12.00 GPU-h unpriced``, ``unknown + 12.00 GPU-h unpriced`` (null USD: none of it priced; never
    ``$0.00``). ``figures`` holds ``key`` and ``<prefix>unpriced_gpu_hours``/``<prefix>unpriced_vcpu_hours``."""
    value = figures.get(key)
    text = "unknown" if value is None else f"${value}"
    for unit, label in (("gpu", "GPU-h"), ("vcpu", "vCPU-h")):
        hours = figures.get(f"{prefix}unpriced_{unit}_hours")
        if hours:
            text += f" + {float(hours):,.2f} {label} unpriced"
    return text


def gpu_hours(value) -> str:
    """GPU-hours with 2 decimals and thousands separators; None as ``-``. Rounded half up from the API's decimal
    string, as the web pages' ``floatformat:2`` rounds, so a figure reads the same in both (a binary float would
    round 0.125 to 0.12 where the page shows 0.13)."""
    if value is None:
        return "-"
    return f"{Decimal(str(value)).quantize(Decimal('0.01'), ROUND_HALF_UP):,}"


def percent(value, digits: int = 1) -> str:
    """A percentage for a table; ``n/a`` for null (no samples: never shown as 0 %)."""
    return "n/a" if value is None else f"{float(value):.{digits}f}%"
