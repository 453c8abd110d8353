"""A table whose rows, each rounded to cents once, add up to more than its total says the rows exceed it by a
positive amount, on the CLI, the pages and the emailed report alike; never ``$-0.01``."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

from django.template import Context, Template
from hypothesis import given
from hypothesis import strategies as st

from core.money import rounding_difference, usd_cents
from cpctl.output import rounding_gap as cli_gap
from frontend.templatetags.money import rounding_gap as page_gap

REPORT_NOTE = Template('{% for table, d in diffs.items %}the {{ table }} rows {% if d|slice:":1" == "-" %}exceed the '
                       'total by ${{ d|slice:"1:" }}{% else %}miss the total by ${{ d }}{% endif %}{% endfor %}')


def test_rows_rounded_up_past_the_total_exceed_it():
    rows = [Decimal("1.335")] * 3  # each shown 1.34 (half to even), the total 4.005 shown 4.00
    difference = rounding_difference(usd_cents(sum(rows)), [usd_cents(r) for r in rows])
    assert difference == "-0.02"
    assert cli_gap(difference) == page_gap(difference) == "exceed the total by $0.02"
    assert REPORT_NOTE.render(Context({"diffs": {"team": difference}})) == "the team rows exceed the total by $0.02"


#: Row amounts, USD: none below a cent but 0 (a row below a cent is shown to two significant digits, another rule).
ROWS = st.lists(st.just(Decimal(0)) | st.decimals(min_value="0.01", max_value=1000, places=3), min_size=1, max_size=12)


@given(ROWS)
def test_the_words_and_the_amount_give_back_the_difference(amounts):
    difference = rounding_difference(usd_cents(sum(amounts)), [usd_cents(a) for a in amounts])
    words = cli_gap(difference)
    assert words == page_gap(difference) and "-" not in words and difference != "-0.00"
    verb, amount = words.split(" the total by $")
    shown = sum(Decimal(a).quantize(Decimal("0.01"), ROUND_HALF_EVEN) for a in amounts)
    total = Decimal(sum(amounts)).quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    assert Decimal(amount) == abs(total - shown)
    assert verb == ("exceed" if shown > total else "miss")
    note = REPORT_NOTE.render(Context({"diffs": {"team": difference}}))
    assert note == f"the team rows {words}"


def test_rows_over_the_total_by_less_than_half_a_cent_add_up():
    rows = [Decimal("1.00"), Decimal("0.0049")]  # shown 1.00 and 0.0049 (two significant digits), the total 1.00
    difference = rounding_difference(usd_cents(sum(rows)), [usd_cents(r) for r in rows])
    assert difference == "0.00"  # no note: the pages and the CLI say nothing when the rows add up to cents
