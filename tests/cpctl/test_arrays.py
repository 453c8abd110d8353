"""``cpctl`` with job arrays against the live API: ``submit`` of a document with ``array:``, ``arrays``, ``array ID``
and ``array cancel ID``; bad input exits non-zero with the field named."""

from __future__ import annotations

import json

import yaml

from jobs.models import Job, JobArray

from .conftest import REPO

SWEEP = REPO / "examples" / "jobs" / "sweep-gpt.yaml"


def write_sweep(tmp_path, **array):
    document = yaml.safe_load(SWEEP.read_text())
    document["team"] = "alpha"
    document["array"].update(array)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_submit_sends_a_document_with_an_array_to_the_arrays_endpoint(run_cli, owner, fleet, tmp_path):
    result = run_cli("submit", str(write_sweep(tmp_path)), persona=owner)
    assert result.code == 0, result.err
    array = JobArray.objects.get()
    assert (array.count, array.parallelism, array.name) == (6, 2, "sweep-gpt")
    assert result.out == (f"array {array.pk} submitted: sweep-gpt (team alpha), 6 elements, at most 2 at once, "
                          f"queued\n")
    assert Job.objects.filter(array=array).count() == 2


def test_a_bad_array_exits_2_naming_the_field(run_cli, owner, fleet, tmp_path):
    result = run_cli("submit", str(write_sweep(tmp_path, parallelism=0)), persona=owner)
    assert result.code == 2
    assert "array.parallelism" in result.err
    assert not JobArray.objects.exists()


def test_arrays_array_and_array_cancel(run_cli, owner, fleet, tmp_path):
    run_cli("submit", str(write_sweep(tmp_path)), persona=owner)
    array = JobArray.objects.get()
    listed = run_cli("arrays", persona=owner)
    assert listed.code == 0, listed.err
    header, row = [line.split() for line in listed.out.strip().splitlines()]
    assert header[:6] == ["ID", "TEAM", "NAME", "STATUS", "COUNT", "PARALLEL"]
    assert row[:7] == [str(array.pk), "alpha", "sweep-gpt", "queued", "6", "2", "6"]
    shown = run_cli("array", str(array.pk), persona=owner)
    assert shown.code == 0, shown.err
    assert "grid" in shown.out and 'lr=[0.003, 0.006, 0.012]' in shown.out and "queued 6" in shown.out
    as_json = json.loads(run_cli("--json", "array", str(array.pk), persona=owner).out)
    assert as_json["id"] == array.pk and as_json["counts"]["queued"] == 6
    cancelled = run_cli("array", "cancel", str(array.pk), persona=owner)
    assert cancelled.code == 0, cancelled.err
    assert cancelled.out.startswith(f"array {array.pk}: cancelled (queued 0, running 0, succeeded 0, failed 0, "
                                    f"cancelled 6")
    again = run_cli("array", "cancel", str(array.pk), persona=owner)
    assert again.code == 6  # conflict: already cancelled
    assert run_cli("array", "nope", persona=owner).code == 2
    assert run_cli("array", "999999", persona=owner).code == 5


def test_jobs_array_lists_only_that_arrays_elements(run_cli, owner, fleet, tmp_path):
    run_cli("submit", str(write_sweep(tmp_path)), persona=owner)
    array = JobArray.objects.get()
    made = sorted(Job.objects.filter(array=array).values_list("pk", flat=True))
    listed = run_cli("jobs", "--array", str(array.pk), persona=owner)
    assert listed.code == 0, listed.err
    assert sorted(int(line.split()[0]) for line in listed.out.strip().splitlines()[1:]) == made
    assert run_cli("jobs", "--array", "0", persona=owner).code == 2
