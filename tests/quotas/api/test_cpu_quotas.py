"""CPU quotas through ``/api/v1/quotas/`` (ADR 0012): a quota of the CPU accelerator counts vCPUs (nominal, borrowing
limit, lending limit, per-job cap) and shows the limit the team can reach; numbers of the other unit, a cluster, a
missing nominal or a lending limit above nominal answer 400 on the field and store nothing; the change is audited.
A CPU-only job over the vCPUs its team's CPU quota can ever reach is refused at submission (400), and one of a team
without a CPU quota is accepted whatever its size."""

from __future__ import annotations

import pytest

from jobs.models import Job
from quotas.models import AuditRecord, Quota

QUOTAS = "/api/v1/quotas/"
JOBS = "/api/v1/jobs/"


def test_staff_set_a_cpu_quota_in_vcpus_and_the_team_sees_the_limit_it_can_reach(staff, teammate, cpu, teams):
    Quota.objects.create(team=teams[1], accelerator=cpu, nominal_vcpus=6, lending_limit_vcpus=5)  # lends 5

    r = staff.client.post(QUOTAS, {"team": "alpha", "accelerator": "CPU", "nominal_vcpus": 16,
                                   "borrowing_limit_vcpus": 8, "max_vcpus_per_job": 12}, format="json")

    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["nominal_vcpus"], body["borrowing_limit_vcpus"], body["max_vcpus_per_job"],
            body["lending_limit_vcpus"]) == (16, 8, 12, None)
    assert (body["limit_vcpus"], body["reachable_vcpus"]) == (24, 16 + 5)  # borrowing 8 capped by beta's 5
    assert (body["nominal_gpus"], body["limit_gpus"], body["reachable_gpus"]) == (0, 0, 0)
    event = AuditRecord.objects.get(action="created")
    assert (event.after["nominal_vcpus"], event.after["borrowing_limit_vcpus"]) == (16, 8)
    listed = teammate.client.get(QUOTAS).json()["results"]
    assert [(q["accelerator"], q["nominal_vcpus"]) for q in listed] == [("CPU", 16)]

    patched = staff.client.patch(f"{QUOTAS}{body['id']}/", {"nominal_vcpus": 4}, format="json")
    assert patched.status_code == 200 and Quota.objects.get(pk=body["id"]).nominal_vcpus == 4


@pytest.mark.parametrize("document, field", [
    ({"nominal_vcpus": 8, "nominal_gpus": 4}, "nominal_gpus"),
    ({"nominal_vcpus": 8, "borrowing_limit_gpus": 2}, "borrowing_limit_gpus"),
    ({"borrowing_limit_vcpus": 8}, "nominal_vcpus"),
    ({"nominal_vcpus": -1}, "nominal_vcpus"),
    ({"nominal_vcpus": "8"}, "nominal_vcpus"),
    ({"nominal_vcpus": 2.5}, "nominal_vcpus"),
    ({"nominal_vcpus": 2**31}, "nominal_vcpus"),
    ({"nominal_vcpus": 8, "borrowing_limit_vcpus": -2}, "borrowing_limit_vcpus"),
    ({"nominal_vcpus": 8, "lending_limit_vcpus": 9}, "lending_limit_vcpus"),
    ({"nominal_vcpus": 8, "max_vcpus_per_job": "all"}, "max_vcpus_per_job"),
    ({"nominal_vcpus": 8, "cluster": "gcp-usc1"}, "cluster"),
], ids=["gpus-on-cpu", "gpu-borrowing-on-cpu", "no-nominal", "negative", "string", "fraction", "too-large",
        "negative-borrowing", "lending-over-nominal", "cap-not-a-number", "per-cluster"])
def test_a_bad_cpu_quota_is_400_on_its_field_and_stores_nothing(staff, cpu, document, field):
    r = staff.client.post(QUOTAS, {"team": "alpha", "accelerator": "CPU", **document}, format="json")

    assert r.status_code == 400, r.content
    assert field in r.json(), r.json()
    assert not Quota.objects.exists() and not AuditRecord.objects.exists()


def test_a_gpu_quota_cannot_count_vcpus(staff, h100):
    r = staff.client.post(QUOTAS, {"team": "alpha", "accelerator": "H100-80GB", "nominal_gpus": 8,
                                   "nominal_vcpus": 16}, format="json")
    assert r.status_code == 400
    assert r.json()["nominal_vcpus"] == ["only a quota of the CPU accelerator counts vCPUs; a GPU quota counts GPUs"]
    missing = staff.client.post(QUOTAS, {"team": "alpha", "accelerator": "H100-80GB"}, format="json")
    assert missing.status_code == 400 and "nominal_gpus" in missing.json()


def test_a_patch_cannot_give_a_cpu_quota_gpus(staff, cpu, teams):
    quota = Quota.objects.create(team=teams[0], accelerator=cpu, nominal_vcpus=8)
    r = staff.client.patch(f"{QUOTAS}{quota.pk}/", {"nominal_gpus": 2}, format="json")
    assert r.status_code == 400 and "nominal_gpus" in r.json()
    assert Quota.objects.get(pk=quota.pk).nominal_gpus == 0


def cpu_submission(submission, **resources) -> dict:
    submission["spec"]["resources"] = {"gpus_per_node": 0, "nodes": 1, "cpu": 4, "memory_gib": 8, **resources}
    submission["spec"]["placement"] = {}
    submission["spec"]["preemptible"] = False
    return submission


def test_a_cpu_only_job_over_the_vcpus_its_team_can_reach_is_refused_at_submission(teammate, cpu, teams, submission):
    Quota.objects.create(team=teams[0], accelerator=cpu, nominal_vcpus=8, borrowing_limit_vcpus=4)  # nobody lends

    r = teammate.client.post(JOBS, cpu_submission(submission, nodes=3, cpu=3), format="json")  # 9 vCPUs

    assert r.status_code == 400, r.content
    assert r.json()["spec.resources"] == [
        "the job asks 9 vCPUs (3 pods x 3), over the 8 vCPUs of CPU quota team alpha can reach (nominal 8 + 0 its "
        "cohort can lend; its borrowing limit is 4)"]
    assert not Job.objects.exists()
    assert teammate.client.post(JOBS, cpu_submission(submission, nodes=2, cpu=4), format="json").status_code == 201


def test_a_cpu_only_job_over_the_per_job_cap_is_refused_and_without_a_cpu_quota_it_is_accepted(
        teammate, cpu, teams, submission):
    quota = Quota.objects.create(team=teams[0], accelerator=cpu, nominal_vcpus=64, max_vcpus_per_job=8)
    r = teammate.client.post(JOBS, cpu_submission(submission, nodes=3, cpu=4), format="json")
    assert r.status_code == 400
    assert r.json()["spec.resources"] == ["the job asks 12 vCPUs (3 pods x 4), over team alpha's per-job cap of "
                                            "8 vCPUs"]

    quota.delete()
    r = teammate.client.post(JOBS, cpu_submission(submission, nodes=4, cpu=16), format="json")  # the whole pool
    assert r.status_code == 201, r.content


def test_a_put_without_the_nominal_of_its_unit_is_400_and_changes_nothing(staff, cpu, alpha):
    quota = Quota.objects.create(team=alpha, accelerator=cpu, nominal_vcpus=8, borrowing_limit_vcpus=2)

    r = staff.client.put(f"{QUOTAS}{quota.pk}/", {"team": "alpha", "accelerator": "CPU", "cluster": None,
                                                  "borrowing_limit_vcpus": 4}, format="json")

    assert r.status_code == 400 and "nominal_vcpus" in r.json(), r.content
    quota.refresh_from_db()
    assert (quota.nominal_vcpus, quota.borrowing_limit_vcpus) == (8, 2)


def test_a_put_resets_the_vcpu_numbers_it_leaves_out_as_it_does_the_gpu_ones(staff, cpu, h100, alpha):
    # a full update replaces the quota: what it leaves out is the default (no borrowing, no per-job cap, all of
    # nominal lendable), for a CPU quota as for a GPU one; a PATCH keeps what it leaves out
    cpu_quota = Quota.objects.create(team=alpha, accelerator=cpu, nominal_vcpus=8, borrowing_limit_vcpus=2,
                                     max_vcpus_per_job=4, lending_limit_vcpus=3)
    gpu_quota = Quota.objects.create(team=alpha, accelerator=h100, nominal_gpus=8, borrowing_limit_gpus=2,
                                     max_gpus_per_job=4, lending_limit_gpus=3)

    r = staff.client.put(f"{QUOTAS}{cpu_quota.pk}/", {"team": "alpha", "accelerator": "CPU", "cluster": None,
                                                      "nominal_vcpus": 16}, format="json")
    g = staff.client.put(f"{QUOTAS}{gpu_quota.pk}/", {"team": "alpha", "accelerator": h100.name, "cluster": None,
                                                      "nominal_gpus": 16}, format="json")

    assert r.status_code == 200 and g.status_code == 200, (r.content, g.content)
    cpu_quota.refresh_from_db()
    gpu_quota.refresh_from_db()
    assert (cpu_quota.nominal_vcpus, cpu_quota.borrowing_limit_vcpus, cpu_quota.max_vcpus_per_job,
            cpu_quota.lending_limit_vcpus) == (16, 0, 0, None)
    assert (gpu_quota.nominal_gpus, gpu_quota.borrowing_limit_gpus, gpu_quota.max_gpus_per_job,
            gpu_quota.lending_limit_gpus) == (16, 0, 0, None)

    p = staff.client.patch(f"{QUOTAS}{cpu_quota.pk}/", {"borrowing_limit_vcpus": 6}, format="json")
    assert p.status_code == 200
    cpu_quota.refresh_from_db()
    assert (cpu_quota.nominal_vcpus, cpu_quota.borrowing_limit_vcpus) == (16, 6)
