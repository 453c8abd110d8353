"""Model FLOPs per token (PaLM appendix B), MFU against a hand computation, and USD per million tokens."""

from __future__ import annotations

from decimal import Decimal

import pytest

from jobs.efficiency.flops import (
    flops_per_token,
    model_flops_utilization,
    transformer_parameters,
    usd_per_million_tokens,
)


def test_flops_per_token_is_6n_plus_12_lhqt():
    # N = 1e9, L = 24, H = 16, Q = 128, T = 2048: 6e9 + 12 x 24 x 16 x 128 x 2048 = 6e9 + 1,207,959,552.
    assert flops_per_token(1e9, 24, 16, 128, 2048) == 6e9 + 1_207_959_552


def test_mfu_by_hand():
    # 8 H100 (989 TFLOP/s dense BF16) at 120,000 tokens/s, 43.2e9 FLOPs per token:
    # 1.2e5 x 43.2e9 = 5.184e15 FLOP/s achieved, over 8 x 989e12 = 7.912e15 peak: 65.52 %.
    mfu = model_flops_utilization(1.2e5, 43.2e9, 8, Decimal("989"))
    assert round(mfu.percent, 2) == 65.52 and mfu.reason == ""


@pytest.mark.parametrize("kwargs, reason", [
    ({"on_cpu": True}, "CPU"),
    ({"peak_tflops": None}, "peak"),
    ({"peak_tflops": Decimal("0")}, "peak"),
    ({"tokens_per_s": None}, "throughput"),
    ({"flops_per_token_": None}, "FLOPs per token"),
])
def test_mfu_is_null_with_the_reason(kwargs, reason):
    args = {"tokens_per_s": 1000.0, "flops_per_token_": 1e9, "gpus": 1, "peak_tflops": Decimal("989"), **kwargs}
    mfu = model_flops_utilization(**args)
    assert mfu.percent is None and reason in mfu.reason


def test_usd_per_million_tokens():
    assert usd_per_million_tokens(Decimal("13.76"), 2_000_000) == Decimal("6.88")
    assert usd_per_million_tokens(Decimal("1"), 0) is None and usd_per_million_tokens(Decimal("1"), None) is None


def test_the_example_gpt_has_the_parameters_of_its_shape():
    # examples/gpt.py defaults: 4 layers, n_embd 64, vocabulary 256, block 128 (tied output projection).
    from examples.gpt import GPT, GPTConfig

    model = GPT(GPTConfig())
    assert sum(p.numel() for p in model.parameters()) == transformer_parameters(4, 64, 256, 128)
