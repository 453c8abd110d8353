"""Usage that decays over time, for fair sharing over time: GPU-seconds whose weight halves every half-life.

A team's decayed usage at time ``t`` is ``U(t) = integral of g(s) * 2 ** (-(t - s) / h) ds`` over its past, where
``g(s)`` is the GPUs its live attempts held at ``s`` (exact shares of a GPU: milli-GPUs / 1000, as quotas count
them, ``jobs.models.held_gpu_milli``) and ``h`` the half-life in seconds: a GPU-second used one half-life ago counts
half, two half-lives ago a quarter. Slurm's multifactor priority decays past usage the same way
(``PriorityDecayHalfLife``, slurm.schedmd.com/priority_multifactor.html), as does Kueue's Admission Fair Sharing
(``usageHalfLifeTime``, kueue.sigs.k8s.io/docs/concepts/admission_fair_sharing/). Between teams the order reads
``U / weight``: Kueue's Admission Fair Sharing orders by the usage of a queue divided by its fair-sharing weight,
lowest first.

The state is one number per team and the time it holds for: ``advance`` moves it to a later time from the spans
each attempt held GPUs meanwhile, so ``advance(advance(u, a, b), b, c) == advance(u, a, c)`` up to the last digit
(the decay of a sum is the sum of the decays) and how often it is sampled changes nothing but rounding.

Pure: no Django, no clock. Times are integer microseconds on one epoch; the arithmetic is Decimal under a local
context of ``PRECISION`` digits, results rounded half-even to ``QUANTUM`` GPU-seconds (one milli-GPU for one
microsecond), so the same inputs give the same digits everywhere.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Iterable
from decimal import Decimal

#: Significant digits of the intermediate arithmetic.
PRECISION = 40
#: The stored resolution, GPU-seconds: a milli-GPU held for a microsecond.
QUANTUM = Decimal("1e-9")
#: Microseconds per second.
US = 1_000_000
#: Milli-GPUs per GPU (``jobs.models.MILLI_PER_GPU``).
MILLI = 1000
ZERO = Decimal(0)
#: The weighted usage of a team of weight 0 or less: it comes after every other (Kueue: weight 0 is an infinite share).
INFINITE = Decimal("Infinity")


def _context() -> decimal.Context:
    return decimal.Context(prec=PRECISION, rounding=decimal.ROUND_HALF_EVEN)


#: ln 2 to ``PRECISION`` digits.
LN2 = _context().ln(Decimal(2))


@functools.lru_cache(maxsize=4096)
def decay_factor(elapsed_us: int, half_life_s: int) -> Decimal:
    """``2 ** (-elapsed / half-life)``: what a GPU-second counts ``elapsed_us`` microseconds later (1 for 0 or less).

    ``half_life_s``: seconds, > 0. Raises ValueError for a half-life of 0 or less (decay is off: nothing decays).
    Remembered per arguments (the teams of one pass share their sample times, so most factors repeat)."""
    if half_life_s <= 0:
        raise ValueError("the half-life must be positive")
    if elapsed_us <= 0:
        return Decimal(1)
    ctx = _context()
    return ctx.exp(ctx.minus(ctx.divide(ctx.multiply(LN2, Decimal(elapsed_us)), Decimal(half_life_s * US))))


def held_integral(held_milli: int, start_us: int, end_us: int, at_us: int, half_life_s: int) -> Decimal:
    """GPU-seconds of ``held_milli`` milli-GPUs held from ``start_us`` to ``end_us``, decayed to ``at_us`` (>= end):
    ``held / 1000 * h / ln 2 * (2 ** (-(at - end) / h) - 2 ** (-(at - start) / h))``, the integral of
    ``held / 1000 * 2 ** (-(at - s) / h)`` over the span, not rounded (``advance`` rounds the sum). An empty span
    gives 0."""
    if end_us <= start_us or held_milli <= 0:
        return ZERO
    ctx = _context()
    near, far = decay_factor(at_us - end_us, half_life_s), decay_factor(at_us - start_us, half_life_s)
    per_gpu = ctx.divide(Decimal(half_life_s), LN2)
    return ctx.multiply(ctx.divide(Decimal(held_milli), Decimal(MILLI)), ctx.multiply(per_gpu, ctx.subtract(near, far)))


def advance(usage: Decimal, since_us: int, at_us: int, spans: Iterable[tuple[int, int, int | None]],
            half_life_s: int) -> Decimal:
    """The decayed usage at ``at_us`` of a team whose decayed usage was ``usage`` (GPU-seconds) at ``since_us``,
    given ``spans``: ``(milli-GPUs held, start µs, end µs or None while still held)`` of its attempts; each counts
    only for its part within ``(since_us, at_us]``. Rounded half-even to ``QUANTUM``. ``at_us <= since_us``: the
    usage as it was (a sample never goes back in time). Raises ValueError for a half-life of 0 or less."""
    if at_us <= since_us:
        return usage
    ctx = _context()
    total = ctx.multiply(usage, decay_factor(at_us - since_us, half_life_s))
    held_over: dict[tuple[int, int], int] = {}  # the integral is linear in what is held: one per distinct span
    for held, start, end in spans:
        lo, hi = max(start, since_us), at_us if end is None else min(end, at_us)
        if hi > lo:
            held_over[(lo, hi)] = held_over.get((lo, hi), 0) + held
    for (lo, hi), held in held_over.items():
        total = ctx.add(total, held_integral(held, lo, hi, at_us, half_life_s))
    return total.quantize(QUANTUM, rounding=decimal.ROUND_HALF_EVEN)


def entry_penalty(sampling_s: int, half_life_s: int) -> Decimal:
    """GPU-seconds per GPU that an admission adds to its team's decayed usage for the rest of its pass: what one
    GPU held for one sampling interval counts at its end, ``h / ln 2 * (1 - 2 ** (-sampling / h))`` (``held_integral``
    over one interval). The idea is Kueue's Admission Fair Sharing entry penalty (a queue's usage grows at
    admission, before the next sample shows it, so one team cannot take every free GPU at once); the amount is
    this integral. 0 for a sampling interval or half-life of 0 or less."""
    if sampling_s <= 0 or half_life_s <= 0:
        return ZERO
    return held_integral(MILLI, 0, sampling_s * US, sampling_s * US, half_life_s).quantize(
        QUANTUM, rounding=decimal.ROUND_HALF_EVEN)


def weighted_usage(usage: Decimal, weight: float | Decimal) -> Decimal:
    """Kueue's Admission Fair Sharing key: decayed usage (GPU-seconds) / the team's fair-sharing weight; a weight
    of 0 or less gives ``INFINITE``. ``weight`` as the snapshot holds it (a float read from a 3-decimal field: its
    shortest repr gives the field's digits back)."""
    w = Decimal(repr(weight)) if isinstance(weight, float) else Decimal(weight)
    if w <= 0:
        return INFINITE
    return _context().divide(usage, w)
