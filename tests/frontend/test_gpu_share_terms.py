"""A job that holds a share of one GPU or a MIG instance is shown by what it holds, never as a whole GPU: in the
job lists (``0.25 of 1 × <accelerator>``, ``1 × <accelerator> MIG 1g.10gb``) and in the job page's attempt rows
(the share and the GPU of the node it was booked on)."""

from __future__ import annotations

import pytest

from tests.support.factories import make_attempt

pytestmark = pytest.mark.django_db


def test_a_quarter_gpu_job_shows_its_share_in_the_list_and_its_attempt_row(teammate_web, alpha_objects, aws_cluster):
    job = alpha_objects["job"]
    job.gpus_per_node, job.nodes, job.gpu_share_milli = 1, 1, 250
    job.save(update_fields=["gpus_per_node", "nodes", "gpu_share_milli"])
    attempt = make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], gpus=1)
    attempt.placement = {"nodes": ["node-a"], "gpu": 3}
    attempt.save(update_fields=["placement"])
    accelerator = job.accelerator.name

    status = teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()
    assert "<td>0.25 of GPU 3</td>" in status, status
    listing = teammate_web.get("/jobs/").content.decode()
    assert f"0.25 of 1 × {accelerator}" in listing, listing
    assert f"<td>1 × {accelerator}</td>" not in listing, listing


def test_a_mig_job_shows_its_profile(teammate_web, alpha_objects, aws_cluster):
    job = alpha_objects["job"]
    job.gpus_per_node, job.nodes, job.gpu_share_milli, job.mig_profile = 1, 1, 143, "1g.10gb"
    job.save(update_fields=["gpus_per_node", "nodes", "gpu_share_milli", "mig_profile"])
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"], gpus=1)

    status = teammate_web.get(f"/jobs/{job.pk}/status/").content.decode()
    assert "<td>MIG 1g.10gb</td>" in status, status
    listing = teammate_web.get("/jobs/").content.decode()
    assert f"1 × {job.accelerator.name} MIG 1g.10gb" in listing, listing
