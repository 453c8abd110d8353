"""One figure per thing, for GPU-hours: the CLI's two decimals are the web pages' (``floatformat:2``) for every
figure the API can send (6 decimals, as a string or a float), ties included."""

from __future__ import annotations

from decimal import Decimal

from django.template.defaultfilters import floatformat
from hypothesis import given
from hypothesis import strategies as st

from cpctl.output import gpu_hours


@given(st.integers(min_value=0, max_value=10**12), st.booleans())
def test_the_cli_rounds_gpu_hours_as_the_pages_do(micro_hours, as_float):
    exact = Decimal(micro_hours).scaleb(-6)
    sent = float(exact) if as_float else str(exact)  # the costs API sends floats, capacity/ decimal strings
    assert gpu_hours(sent).replace(",", "") == floatformat(str(exact), 2)


def test_a_tie_reads_the_same():
    assert gpu_hours(0.125) == floatformat("0.125", 2) == "0.13"
