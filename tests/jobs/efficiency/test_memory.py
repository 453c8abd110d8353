"""The memory estimator against ZeRO's table 1 and hand-worked cases for each ZeRO stage, tensor and pipeline degree,
activation recomputation, and the smallest change that fits. Expected bytes are worked out here from the papers."""

from __future__ import annotations

import pytest

from jobs.efficiency.memory import (
    GIB,
    Layout,
    activations_per_layer,
    declaration_errors,
    estimate,
    fit_errors,
    smallest_changes,
)

GB = 1e9


@pytest.mark.parametrize("stage, published_gb", [(0, "120"), (1, "31.4"), (2, "16.6"), (3, "1.88")])
def test_model_states_match_zero_table_1(stage, published_gb):
    # Rajbhandari et al. 2020, table 1: Ψ = 7.5 B, Nd = 64, mixed-precision Adam (K = 12).
    est = estimate({"parameters": 7_500_000_000}, Layout(gpus=64, zero_stage=stage))
    digits = len(published_gb.split(".")[1]) if "." in published_gb else 0
    assert f"{est.model_states / GB:.{digits}f}" == published_gb
    assert est.activations is None


def test_each_stage_shards_its_part_over_the_data_parallel_ranks_after_tensor_and_pipeline():
    # Ψ = 1e9 on 8 GPUs with t = 2, p = 2: Ψ' = 2.5e8 per model-parallel rank, Nd = 2.
    psi = 2.5e8
    by_stage = {}
    for stage in range(4):
        est = estimate({"parameters": 1_000_000_000}, Layout(gpus=8, zero_stage=stage, tensor=2, pipeline=2))
        assert est.data_parallel == 2
        by_stage[stage] = (est.weights, est.gradients, est.optimizer_states)
    assert by_stage[0] == (2 * psi, 2 * psi, 12 * psi)  # 4e9 in all
    assert by_stage[1] == (2 * psi, 2 * psi, 6 * psi)  # 2.5e9
    assert by_stage[2] == (2 * psi, 1 * psi, 6 * psi)  # 2.25e9
    assert by_stage[3] == (1 * psi, 1 * psi, 6 * psi)  # 2e9


def test_sgd_and_fp32_keep_fewer_optimizer_bytes():
    assert estimate({"parameters": 10, "optimizer": "sgd"}, Layout(1)).model_states == 10 * (2 + 2 + 8)
    assert estimate({"parameters": 10, "precision": "fp32"}, Layout(1)).model_states == 10 * (4 + 4 + 8)


# s = 2048, b = 1, h = 4096, a = 32: s·b·h = 8,388,608; 5·a·s/h = 80.
SBH = 2048 * 4096


@pytest.mark.parametrize("t, sp, recompute, expected", [
    (1, False, "none", SBH * (34 + 80)),
    (8, False, "none", SBH * (10 + 3 + 10)),  # 10 + 24/8 + 80/8
    (8, True, "none", SBH * (34 / 8 + 10)),
    (1, False, "selective", SBH * 34),
    (8, True, "selective", SBH * 34 / 8),
    (8, False, "selective", SBH * (10 + 3)),
    (1, False, "full", 2 * SBH),
    (8, True, "full", 2 * SBH / 8),
    (8, False, "full", 2 * SBH),
])
def test_activations_per_layer_follow_korthikanti(t, sp, recompute, expected):
    assert activations_per_layer(2048, 1, 4096, 32, t, sp, recompute) == pytest.approx(expected)


def test_the_first_pipeline_stage_holds_p_micro_batches_of_its_layers():
    shape = {"layers": 30, "hidden_size": 4096, "heads": 32, "sequence_length": 2048, "micro_batch_size": 1}
    per_layer = SBH * 114
    assert estimate(shape, Layout(4, pipeline=1)).activations == pytest.approx(30 * per_layer)
    assert estimate(shape, Layout(4, pipeline=4)).activations == pytest.approx(8 * 4 * per_layer)  # ceil(30/4) x 4
    assert estimate({**shape, "micro_batch_size": 2}, Layout(4, pipeline=2)).activations == \
        pytest.approx(15 * 2 * 2 * per_layer)


def test_a_model_without_parameters_counts_them_from_its_shape():
    # 2 layers of width 64: 2 x (12·64² + 13·64) = 99,968; embeddings (256 + 128) x 64 = 24,576; final LN 128.
    est = estimate({"layers": 2, "hidden_size": 64, "vocab_size": 256, "sequence_length": 128}, Layout(1))
    assert est.model_states == 16 * (99_968 + 24_576 + 128)


@pytest.mark.parametrize("model, layout, field", [
    ({"layers": 4, "hidden_size": 64, "heads": 3}, Layout(8), "model.heads"),
    ({"parameters": 10}, Layout(8, tensor=3), "parallelism.tensor_parallel"),
    ({"parameters": 10}, Layout(8, tensor=2, pipeline=3), "parallelism.pipeline_parallel"),
    ({"layers": 4, "hidden_size": 64}, Layout(8, pipeline=8), "parallelism.pipeline_parallel"),
    ({"layers": 4, "hidden_size": 64, "heads": 2}, Layout(8, tensor=4), "parallelism.tensor_parallel"),
    ({"heads": 2}, Layout(1), "model"),
])
def test_impossible_declarations_name_the_field(model, layout, field):
    assert field in declaration_errors(model, layout)


def test_a_consistent_declaration_has_no_errors():
    assert declaration_errors({"layers": 8, "hidden_size": 64, "heads": 4}, Layout(8, tensor=2, pipeline=4)) == {}


def test_the_smallest_change_of_each_kind_that_fits():
    # Ψ = 7.5 B on 1 node of 8 GPUs, 80 GiB each, DDP: 120 GB = 111.76 GiB does not fit.
    model = {"parameters": 7_500_000_000}
    capacity = 80 * GIB
    changes = smallest_changes(model, Layout(8), capacity, gpus_per_node=8,
                               accelerators=[("L4", 24 * GIB), ("H200", 141 * GIB)])
    # Stage 1 (4Ψ + 12Ψ/8 = 41.25 GB) fits; more nodes do not help without sharding; 141 GiB holds 120 GB.
    assert [(c.field, c.value) for c in changes] == [("spec.parallelism.zero_stage", 1),
                                                      ("spec.resources.accelerator", "H200")]
    assert changes[0].estimate.total == 41.25 * GB
    # At stage 1 on 1 x 4 GPUs (30 GB + 22.5 GB = 52.5 GB) and a 40 GiB GPU: stage 2 (15 + 26.25 = 41.25 GB =
    # 38.4 GiB) fits; more nodes: 2 nodes (Nd = 8: 30 + 11.25 = 41.25 GB) fits.
    changes = smallest_changes(model, Layout(4, zero_stage=1), 40 * GIB, gpus_per_node=4)
    assert [(c.field, c.value) for c in changes] == [("spec.parallelism.zero_stage", 2), ("spec.resources.nodes", 2)]


def test_recomputation_is_offered_when_activations_do_not_fit():
    model = {"parameters": 1_000_000, "layers": 32, "hidden_size": 4096, "heads": 32, "sequence_length": 2048,
             "micro_batch_size": 4}
    # no recomputation: 32 x 4 x SBH x 114 = 114.0 GiB; selective: 32 x 4 x SBH x 34 = 34 GiB; + 16 MB of states.
    changes = smallest_changes(model, Layout(1), 80 * GIB, gpus_per_node=1)
    assert [(c.field, c.value) for c in changes] == [("spec.model.activation_recomputation", "selective")]
    assert changes[0].estimate.activations == 32 * 4 * SBH * 34


def test_the_fit_message_breaks_the_estimate_down_and_names_the_changes():
    errors = fit_errors({"parameters": 7_500_000_000}, Layout(8), "H100-80GB", 80, gpus_per_node=8,
                        accelerators=lambda: [("H100-80GB", 80)])
    summary, changes = errors["model"]
    # weights 15e9 B = 13.97 GiB, gradients 13.97 GiB, optimizer 90e9 B = 83.82 GiB, total 111.76 GiB.
    assert "weights 13.97 GiB + gradients 13.97 GiB + optimizer states 83.82 GiB" in summary
    assert "= 111.76 GiB per GPU" in summary and "80 GiB of one H100-80GB" in summary
    assert changes == "smallest changes that fit: spec.parallelism.zero_stage: 1 (38.42 GiB per GPU)"
    assert fit_errors({"parameters": 7_500_000_000}, Layout(8, zero_stage=1), "H100-80GB", 80, gpus_per_node=8) == {}


def test_more_nodes_keep_the_model_parallel_group_whole():
    # Ψ = 80 B with t = 2, p = 2 (Ψ' = 2e10) at stage 3 on 2 nodes x 2 GPUs (Nd = 1): 16 x 2e10 / Nd bytes per GPU
    # fit 40 GiB (42.95e9 B) from Nd = 8, i.e. 32 GPUs = 16 nodes (an even count: 4 GPUs per group).
    changes = smallest_changes({"parameters": 80_000_000_000}, Layout(4, zero_stage=3, tensor=2, pipeline=2),
                               40 * GIB, gpus_per_node=2)
    assert [(c.field, c.value) for c in changes] == [("spec.resources.nodes", 16)]
    assert changes[0].estimate.total == 16 * 2e10 / 8 and changes[0].estimate.data_parallel == 8
