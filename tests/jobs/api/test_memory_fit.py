"""The memory-fit check of POST /api/v1/jobs/: a declared model that cannot fit its accelerator answers 400 with the
estimate broken down and the smallest change that fits; impossible declarations name their field; no declaration
is admitted as before. Expected figures are worked out here (ZeRO section 3, 16 bytes per parameter)."""

from __future__ import annotations

import pytest

from jobs.models import Job

JOBS = "/api/v1/jobs/"
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("alpha_h100_quota")]

# 30 B parameters on 2 nodes x 8 H100-80GB (16 GPUs, Nd = 16), mixed-precision Adam:
#   DDP 16 x 30e9 = 480e9 B = 447.03 GiB; stage 1 4Ψ + 12Ψ/16 = 142.5e9 B; stage 2 2Ψ + 14Ψ/16 = 86.25e9 B
#   = 80.33 GiB (still over 80 GiB); stage 3 16Ψ/16 = 30e9 B = 27.94 GiB.
THIRTY_B = {"parameters": 30_000_000_000}


def test_a_model_that_cannot_fit_answers_400_with_the_breakdown_and_the_smallest_change(
        teammate, aws_cluster, submission):
    submission["spec"]["model"] = THIRTY_B
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400, r.content
    summary, changes = r.json()["spec.model"]
    assert "does not fit the 80 GiB of one H100-80GB" in summary
    assert "weights 55.88 GiB + gradients 55.88 GiB + optimizer states 335.28 GiB" in summary
    assert "= 447.03 GiB per GPU (16 data-parallel ranks)" in summary
    assert changes == "smallest changes that fit: spec.parallelism.zero_stage: 3 (27.94 GiB per GPU)"
    assert not Job.objects.exists()


def test_a_model_that_fits_is_admitted_with_its_declaration_stored(teammate, aws_cluster, submission):
    submission["spec"]["model"] = THIRTY_B
    submission["spec"]["parallelism"] = {"zero_stage": 3}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    spec = Job.objects.get().spec
    assert spec["model"]["parameters"] == 30_000_000_000 and spec["model"]["optimizer"] == "adam"
    assert spec["parallelism"] == {"zero_stage": 3, "tensor_parallel": 1, "pipeline_parallel": 1,
                                   "sequence_parallel": False}


def test_stage_2_is_still_refused_by_a_third_of_a_gib(teammate, aws_cluster, submission):
    submission["spec"]["model"] = THIRTY_B
    submission["spec"]["parallelism"] = {"zero_stage": 2}
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert "= 80.33 GiB per GPU" in r.json()["spec.model"][0]


def test_no_declaration_keeps_the_spec_as_before(teammate, aws_cluster, submission):
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 201, r.content
    assert "model" not in Job.objects.get().spec and "parallelism" not in Job.objects.get().spec


@pytest.mark.parametrize("model, parallelism, field", [
    ({"layers": 4, "hidden_size": 64, "heads": 3}, {}, "spec.model.heads"),
    ({"parameters": 1000}, {"tensor_parallel": 3}, "spec.parallelism.tensor_parallel"),
    ({"parameters": 1000}, {"tensor_parallel": 2, "pipeline_parallel": 3}, "spec.parallelism.pipeline_parallel"),
    ({"layers": 4, "hidden_size": 64}, {"pipeline_parallel": 8}, "spec.parallelism.pipeline_parallel"),
    ({"parameters": 1000}, {"zero_stage": 4}, "spec.parallelism.zero_stage"),
    ({"parameters": 0}, {}, "spec.model.parameters"),
    ({"parameters": 1000, "precision": "int4"}, {}, "spec.model.precision"),
    ({"parameters": 1000, "dropout": 0.1}, {}, "spec.model.dropout"),
])
def test_an_impossible_declaration_answers_400_naming_the_field(teammate, aws_cluster, submission, model,
                                                                 parallelism, field):
    submission["spec"]["model"] = model
    submission["spec"]["parallelism"] = parallelism
    r = teammate.client.post(JOBS, submission, format="json")
    assert r.status_code == 400
    assert field in r.json(), r.json()
    assert not Job.objects.exists()
