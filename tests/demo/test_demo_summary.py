"""The demo's summary line for the training job carries its efficiency as the job's page shows it: throughput, MFU
(or why none) and USD per million tokens, each once known; and its GPU utilization whenever it was collected, as its
page shows it, emulated GPUs or not."""

from __future__ import annotations

from demo.run import efficiency_text, utilization_text


def test_the_summary_shows_usd_per_million_tokens_even_before_throughput():
    assert efficiency_text({"usd_per_million_tokens": "2.752000"}) == "  $2.75 per million tokens"


def test_the_summary_shows_throughput_mfu_and_usd_per_million_tokens():
    text = efficiency_text({"tokens_per_s": 1234.4, "mfu_percent": None, "mfu_reason": "CPU: no peak FLOP/s",
                            "usd_per_million_tokens": "0.000125"})
    # 0.000125 is below half a cent: two significant digits, half to even (0.00012), never $0.00.
    assert text == "  1234 tokens/s, MFU n/a (CPU)  $0.00012 per million tokens"


def test_nothing_collected_says_nothing():
    assert efficiency_text({}) == ""


def test_utilization_collected_on_emulated_gpus_is_shown_as_the_page_shows_it():
    assert utilization_text(47.671, emulated=True, monitored=True) == \
        "  GPU util 47.7% (emulated GPUs: the CPU use of its processes)"
    assert utilization_text(47.671, emulated=False, monitored=True) == "  GPU util 47.7%"


def test_no_utilization_says_why():
    assert utilization_text(None, emulated=True, monitored=False) == "  GPU util not observed (no prometheus on PATH)"
    assert utilization_text(None, emulated=True, monitored=True) == "  GPU util no data"
