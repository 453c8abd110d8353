"""Job arrays and parameter sweeps (``/api/v1/arrays/``, ``jobs.arrays``, docs/adr/0038).

An array of 50 elements with parallelism 8 never has more than 8 elements live (queued or running) and so never
runs more than 8, whatever the capacity, at every step of scheduling passes and element ends; its cancel stops the
running elements and every element not yet made. Elements carry their array's variables; a grid expands in the
order of ``itertools.product``; bad ``array`` fields are 400s naming the field; arrays are team-scoped.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.arrays import array_env, grid_point
from jobs.lifecycle import cancel_job, end_attempt, finish_cancel
from jobs.models import Job, JobArray, JobAttempt, JobEvent, JobState
from jobs.scheduling.passes import schedule_pending
from runners.local.runner import node_env
from tests.support.factories import VALID_SPEC, make_attempt, make_cost_entry, run
from tests.support.personas import signed_in

ARRAYS = "/api/v1/arrays/"
S = JobState
RUNNING_SIDE = (S.ADMITTED, S.STARTING, S.RUNNING, S.CANCELLING)
LIVE = (S.QUEUED, S.ADMITTED, S.STARTING, S.RUNNING, S.RECOVERING, S.CANCELLING)

pytestmark = pytest.mark.usefixtures("alpha_h100_quota")


def one_gpu_spec() -> dict:
    spec = copy.deepcopy(VALID_SPEC)
    spec["resources"].update(gpus_per_node=1, nodes=1)
    spec["priority"] = "normal"
    spec["preemptible"] = False
    return spec


def array_body(array: dict, *, name: str = "sweep", team: str = "alpha") -> dict:
    return {"team": team, "name": name, "kind": "training", "spec": one_gpu_spec(), "array": array}


@pytest.fixture
def roomy(cluster_factory, h100):
    """A pool of 8 nodes x 8 H100 (64 GPUs): room for far more than 8 one-GPU elements at once."""
    return cluster_factory("roomy", "aws", "us-east-1", h100, nodes=8, gpus_per_node=8, price="2.00")


def element_states(array_id: int) -> list[str]:
    return list(Job.objects.filter(array_id=array_id).values_list("state", flat=True))


def assert_within_parallelism(array_id: int, parallelism: int) -> None:
    states = element_states(array_id)
    running = sum(s in RUNNING_SIDE for s in states)
    live = sum(s in LIVE for s in states)
    assert running <= parallelism, f"{running} elements hold capacity, parallelism {parallelism}"
    assert live <= parallelism, f"{live} elements live, parallelism {parallelism}"


# --- grid expansion and element environment ----------------------------------------------------------------------


def test_grid_points_follow_itertools_product_over_the_parameters_as_submitted():
    grid = [["lr", [0.001, 0.0003, 1e-05]], ["batch", [16, 32]], ["opt", ["adam", "sgd"]], ["warm", [True]]]
    expected = [
        dict(zip(["lr", "batch", "opt", "warm"], point, strict=True))
        for point in itertools.product(*(values for _, values in grid))
    ]
    assert [grid_point(grid, i) for i in range(12)] == expected
    assert grid_point(grid, 1) == {"lr": 0.001, "batch": 16, "opt": "sgd", "warm": True}  # the last varies fastest
    with pytest.raises(IndexError):
        grid_point(grid, 12)


def test_an_elements_environment_names_its_array_index_count_and_sweep_values():
    grid = [["lr", [0.001, 3e-05]], ["batch_size", [16, 32]], ["tag", ["a b"]], ["flag", [False]]]
    assert array_env(7, 2, 4, grid) == {
        "CONTROLPLANE_ARRAY_ID": "7",
        "CONTROLPLANE_ARRAY_INDEX": "2",
        "CONTROLPLANE_ARRAY_COUNT": "4",
        "SWEEP_LR": "3e-05",
        "SWEEP_BATCH_SIZE": "16",
        "SWEEP_TAG": "a b",
        "SWEEP_FLAG": "false",
    }
    assert array_env(7, 0, 3, []) == {
        "CONTROLPLANE_ARRAY_ID": "7",
        "CONTROLPLANE_ARRAY_INDEX": "0",
        "CONTROLPLANE_ARRAY_COUNT": "3",
    }


def test_the_local_runner_gives_each_element_its_sweep_values(teammate, roomy):
    body = array_body({"grid": {"lr": [0.1, 0.2], "batch": [8, 16, 32]}, "parallelism": 6})
    body["spec"]["env"] = {"SWEEP_LR": "overridden", "MINE": "kept"}
    array_id = teammate.client.post(ARRAYS, body, format="json").json()["id"]
    schedule_pending()
    cluster, pool = roomy
    seen = {}
    for job in Job.objects.filter(array_id=array_id).select_related("team"):
        attempt = job.current_attempt or make_attempt(job, cluster, pool)
        attempt.job = job
        meta = {"devices": None, "nodes": 1, "master_port": 29500, "checkpoint_dir": "/tmp/x", "ports": [9000]}
        env = node_env(attempt, meta, 0)
        assert env["MINE"] == "kept" and env["CONTROLPLANE_ARRAY_ID"] == str(array_id)
        assert env["CONTROLPLANE_ARRAY_COUNT"] == "6" and env["CONTROLPLANE_JOB_ID"] == str(job.pk)
        seen[int(env["CONTROLPLANE_ARRAY_INDEX"])] = (env["SWEEP_LR"], env["SWEEP_BATCH"])
    assert seen == {
        0: ("0.1", "8"),
        1: ("0.1", "16"),
        2: ("0.1", "32"),
        3: ("0.2", "8"),
        4: ("0.2", "16"),
        5: ("0.2", "32"),
    }


def test_the_kubernetes_pods_carry_the_elements_variables(teammate, roomy):
    from runners.kubernetes.manifests import _platform_env
    from runners.kubernetes.runner import workload

    array_id = teammate.client.post(ARRAYS, array_body({"grid": {"lr": [0.5, 0.25]}}), format="json").json()["id"]
    schedule_pending()
    job = Job.objects.get(array_id=array_id, array_index=1)
    env = {e["name"]: e["value"] for e in _platform_env(workload(job.current_attempt))}
    assert (env["CONTROLPLANE_ARRAY_ID"], env["CONTROLPLANE_ARRAY_INDEX"]) == (str(array_id), "1")
    assert (env["CONTROLPLANE_ARRAY_COUNT"], env["SWEEP_LR"]) == ("2", "0.25")


def test_the_elements_of_one_array_read_its_count_and_grid_once(teammate, roomy):
    """A dispatch batch holds up to 25 elements of one array: their manifests read the array's row once, not once
    per element, and each still gets its own sweep values."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runners.kubernetes.manifests import _platform_env
    from runners.kubernetes.runner import workload

    body = array_body({"grid": {"lr": [0.5, 0.25, 0.125, 0.0625]}, "parallelism": 4})
    array_id = teammate.client.post(ARRAYS, body, format="json").json()["id"]
    schedule_pending()
    jobs = list(Job.objects.filter(array_id=array_id, current_attempt__isnull=False).order_by("array_index"))
    assert len(jobs) == 4
    attempts = [job.current_attempt for job in jobs]
    with CaptureQueriesContext(connection) as queries:
        envs = [{e["name"]: e["value"] for e in _platform_env(workload(attempt))} for attempt in attempts]
    assert len([q for q in queries.captured_queries if '"jobs_jobarray"' in q["sql"]]) == 1
    assert [(env["CONTROLPLANE_ARRAY_INDEX"], env["CONTROLPLANE_ARRAY_COUNT"], env["SWEEP_LR"]) for env in envs] == [
        ("0", "4", "0.5"),
        ("1", "4", "0.25"),
        ("2", "4", "0.125"),
        ("3", "4", "0.0625"),
    ]


# --- submission ------------------------------------------------------------------------------------------------


def test_a_submitted_array_is_one_row_with_its_first_window_of_elements(teammate, roomy, settings):
    settings.ARRAY_QUEUED_WINDOW = 5
    r = teammate.client.post(ARRAYS, array_body({"count": 50, "parallelism": 8}), format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["name"], body["team"], body["count"], body["parallelism"]) == ("sweep", "alpha", 50, 8)
    assert body["status"] == "queued" and body["cost_usd"] == "0.00"
    assert body["counts"]["queued"] == 50 and sum(body["counts"].values()) == 50
    assert body["materialized"] == 5 and r["Location"].endswith(f"{ARRAYS}{body['id']}/")
    elements = list(Job.objects.filter(array_id=body["id"]).order_by("array_index"))
    assert [(j.array_index, j.name, j.state) for j in elements] == [(i, f"sweep-{i}", "QUEUED") for i in range(5)]
    assert all(j.created_at == elements[0].created_at for j in elements)
    assert [list(j.events.values_list("kind", flat=True)) for j in elements] == [["submitted"]] * 5
    assert teammate.client.get(f"{ARRAYS}{body['id']}/").json()["counts"] == body["counts"]


def test_a_grid_sets_the_count_and_a_count_that_matches_it_is_accepted(teammate, roomy):
    r = teammate.client.post(ARRAYS, array_body({"grid": {"lr": [1, 2, 3], "bs": [4, 5]}}), format="json")
    assert r.status_code == 201, r.content
    assert (r.json()["count"], r.json()["parallelism"], r.json()["grid"]) == (6, 6, {"lr": [1, 2, 3], "bs": [4, 5]})
    r = teammate.client.post(ARRAYS, array_body({"grid": {"lr": [1, 2]}, "count": 2, "parallelism": 9}), format="json")
    assert r.status_code == 201 and (r.json()["count"], r.json()["parallelism"]) == (2, 2)


def test_an_array_submitted_as_yaml_is_accepted(teammate, roomy):
    import yaml

    text = yaml.safe_dump(array_body({"grid": {"lr": [0.1, 0.01]}, "parallelism": 1}))
    r = teammate.client.generic("POST", ARRAYS, text, content_type="application/yaml")
    assert r.status_code == 201, r.content
    assert r.json()["grid"] == {"lr": [0.1, 0.01]}


@pytest.mark.parametrize(
    ("array", "field"),
    [
        ({"count": 0}, "array.count"),
        ({"count": -3}, "array.count"),
        ({"count": "5"}, "array.count"),
        ({"count": True}, "array.count"),
        ({"count": 10001}, "array.count"),
        ({"count": 5, "parallelism": 0}, "array.parallelism"),
        ({"count": 5, "parallelism": 2.5}, "array.parallelism"),
        ({"parallelism": 2}, "array"),
        ({}, "array"),
        ([5], "array"),
        ({"count": 5, "every": 2}, "array"),
        ({"grid": {}}, "array.grid"),
        ({"grid": [["lr", [1]]]}, "array.grid"),
        ({"grid": {"learning-rate": [1, 2]}}, "array.grid.learning-rate"),
        ({"grid": {"1lr": [1, 2]}}, "array.grid.1lr"),
        ({"grid": {"lr": [1], "LR": [2]}}, "array.grid.LR"),
        ({"grid": {"lr": []}}, "array.grid.lr"),
        ({"grid": {"lr": 0.1}}, "array.grid.lr"),
        ({"grid": {"lr": [0.1, None]}}, "array.grid.lr"),
        ({"grid": {"lr": [[0.1]]}}, "array.grid.lr"),
        ({"grid": {"lr": [{"a": 1}]}}, "array.grid.lr"),
        ({"grid": {"a": list(range(101)), "b": list(range(100))}}, "array.grid"),
        ({"grid": {"lr": [1, 2], "bs": [1, 2, 3]}, "count": 5}, "array.count"),
    ],
)
def test_a_bad_array_field_is_a_400_naming_it_and_stores_nothing(teammate, roomy, array, field):
    r = teammate.client.post(ARRAYS, array_body(array), format="json")
    assert r.status_code == 400, r.content
    assert field in r.json(), r.json()
    assert r.json()[field] and all(isinstance(m, str) and m for m in r.json()[field])
    assert not JobArray.objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize(("value", "text"), [(1e20, "1e+20"), (-0.0, "-0.0"), (1.5e300, "1.5e+300")])
def test_a_grid_number_the_database_would_store_as_another_is_a_400_on_its_parameter(teammate, roomy, value, text):
    # PostgreSQL's jsonb keeps numbers as numeric: 1e+20 comes back the integer 100000000000000000000 and -0.0 as
    # 0.0, so an element's SWEEP_ value would depend on the database
    r = teammate.client.post(ARRAYS, array_body({"grid": {"lr": [0.1, value]}}), format="json")

    assert r.status_code == 400, r.content
    assert r.json() == {
        "array.grid.lr": [
            f"item 1: {text} would be stored as another number (PostgreSQL keeps "
            f"numbers as numeric, without a float's exponent or sign of zero); give "
            f'it as a string ("{text}"), or as an integer'
        ]
    }
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_grid_numbers_come_back_from_the_database_as_submitted(teammate, roomy):
    values = [1e-05, 0.0003, 1.5e-07, 1.0, 1e15, 64, 10**20, True]
    r = teammate.client.post(ARRAYS, array_body({"grid": {"lr": values}}), format="json")
    assert r.status_code == 201, r.content

    stored = JobArray.objects.get(pk=r.json()["id"]).grid
    assert stored == [["lr", values]]
    assert [type(v) for v in stored[0][1]] == [type(v) for v in values]
    texts = ["1e-05", "0.0003", "1.5e-07", "1.0", "1000000000000000.0", "64", "100000000000000000000", "true"]
    assert [array_env(1, i, len(values), stored)["SWEEP_LR"] for i in range(len(values))] == texts


def test_the_maximum_is_the_setting(teammate, roomy, settings):
    settings.ARRAY_MAX_ELEMENTS = 20
    assert teammate.client.post(ARRAYS, array_body({"count": 21}), format="json").status_code == 400
    assert teammate.client.post(ARRAYS, array_body({"count": 20}), format="json").status_code == 201


def test_a_missing_array_field_and_a_bad_template_are_reported_together(teammate, roomy):
    body = array_body({"count": 0})
    body["spec"]["resources"]["gpus_per_node"] = 0
    r = teammate.client.post(ARRAYS, body, format="json")
    assert r.status_code == 400
    assert "array.count" in r.json() and "spec.resources.gpus_per_node" in r.json()
    del body["array"]
    body["spec"] = one_gpu_spec()
    r = teammate.client.post(ARRAYS, body, format="json")
    assert r.status_code == 400 and list(r.json()) == ["array"]


def test_a_name_too_long_for_its_element_names_is_refused(teammate, roomy):
    r = teammate.client.post(ARRAYS, array_body({"count": 100}, name="n" * 61), format="json")
    assert r.status_code == 400 and "name" in r.json()
    assert teammate.client.post(ARRAYS, array_body({"count": 100}, name="n" * 60), format="json").status_code == 201


def test_the_template_is_refused_as_one_job_would_be(teammate, roomy, alpha_h100_quota):
    alpha_h100_quota.max_gpus_per_job = 1
    alpha_h100_quota.save()
    body = array_body({"count": 3})
    body["spec"]["resources"]["gpus_per_node"] = 2
    r = teammate.client.post(ARRAYS, body, format="json")
    assert r.status_code == 400 and "per-job cap" in r.json()["spec.resources"][0], r.json()
    assert not JobArray.objects.exists()


def test_an_array_that_would_wait_for_a_job_is_refused_on_after(teammate, roomy):
    """Elements are made by the scheduling passes, so an array does not take ``after``: a 400 naming it, nothing
    stored (an existing job of the team is named, so the reference itself is valid)."""
    first = teammate.client.post(ARRAYS, array_body({"count": 1}, name="first"), format="json")
    assert first.status_code == 201, first.content
    element = Job.objects.filter(array_id=first.json()["id"]).values_list("pk", flat=True).first()
    body = array_body({"count": 2}, name="second")
    body["after"] = [{"job": element, "condition": "succeeded"}]
    r = teammate.client.post(ARRAYS, body, format="json")
    assert r.status_code == 400 and list(r.json()) == ["after"], r.content
    assert JobArray.objects.count() == 1


def test_an_array_of_multi_role_jobs_is_refused_on_kind(teammate, roomy):
    role = {
        "image": "python:3.11",
        "command": ["python", "learn.py"],
        "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1},
    }
    body = {
        "team": "alpha",
        "name": "rl",
        "kind": "multi-role",
        "array": {"count": 2},
        "spec": {"roles": {"learner": role, "rollout": {**role, "completion": False}}, "max_runtime_seconds": 600},
    }
    r = teammate.client.post(ARRAYS, body, format="json")
    assert r.status_code == 400 and list(r.json()) == ["kind"], r.content
    assert not JobArray.objects.exists()


# --- team scoping ----------------------------------------------------------------------------------------------


def test_arrays_are_seen_by_their_team_only(teammate, viewer, outsider, staff, roomy):
    array_id = teammate.client.post(ARRAYS, array_body({"count": 3}), format="json").json()["id"]
    for persona in (teammate, viewer, staff):
        assert persona.client.get(f"{ARRAYS}{array_id}/").status_code == 200
        assert [a["id"] for a in persona.client.get(ARRAYS).json()["results"]] == [array_id]
    assert outsider.client.get(f"{ARRAYS}{array_id}/").status_code == 404
    assert outsider.client.get(f"{ARRAYS}{array_id}/elements/").status_code == 404
    assert outsider.client.post(f"{ARRAYS}{array_id}/cancel/").status_code == 404
    assert outsider.client.get(ARRAYS).json()["results"] == []
    # Submitting for a team the user is not in is refused on the team, as for one job.
    r = outsider.client.post(ARRAYS, array_body({"count": 3}), format="json")
    assert r.status_code == 400 and "team" in r.json()
    assert viewer.client.post(ARRAYS, array_body({"count": 3}), format="json").status_code == 400
    assert viewer.client.post(f"{ARRAYS}{array_id}/cancel/").status_code == 403


def test_the_list_filters_like_the_job_list(teammate, owner, roomy):
    first = teammate.client.post(ARRAYS, array_body({"count": 2}, name="one"), format="json").json()["id"]
    second = owner.client.post(ARRAYS, array_body({"count": 2}, name="two"), format="json").json()["id"]
    assert [a["id"] for a in teammate.client.get(ARRAYS).json()["results"]] == [second, first]
    assert [a["id"] for a in teammate.client.get(f"{ARRAYS}?submitter=teammate").json()["results"]] == [first]
    assert [a["id"] for a in teammate.client.get(f"{ARRAYS}?ordering=created_at").json()["results"]] == [first, second]
    assert teammate.client.get(f"{ARRAYS}?state=nonsense").status_code == 400
    assert [a["id"] for a in teammate.client.get(f"{ARRAYS}?state=materialized").json()["results"]] == [second, first]


# --- parallelism, roll-ups and cancel under the scheduler ----------------------------------------------------------


def _finish_admitted(array_id: int, outcome_of) -> int:
    """Run every ADMITTED element and end every RUNNING one with ``outcome_of(index)``; returns how many ended."""
    for job in Job.objects.filter(array_id=array_id, state=S.ADMITTED):
        run(job)
    ended = 0
    for job in Job.objects.filter(array_id=array_id, state=S.RUNNING):
        to = outcome_of(job.array_index)
        end_attempt(
            job,
            job.current_attempt,
            to,
            reason="done",
            end_reason="Succeeded" if to == S.SUCCEEDED else "Failed",
            exit_code=0 if to == S.SUCCEEDED else 1,
        )
        ended += 1
    return ended


def test_an_array_of_50_with_parallelism_8_never_runs_more_than_8(teammate, roomy, settings):
    settings.ARRAY_QUEUED_WINDOW = 3  # fewer rows waiting than the parallelism: passes must top up repeatedly
    array_id = teammate.client.post(ARRAYS, array_body({"count": 50, "parallelism": 8}), format="json").json()["id"]
    most_running, passes = 0, 0
    while (
        Job.objects.filter(array_id=array_id, state__in=LIVE).exists()
        or JobArray.objects.get(pk=array_id).materialized < 50
    ):
        schedule_pending()
        passes += 1
        assert_within_parallelism(array_id, 8)
        for job in Job.objects.filter(array_id=array_id, state=S.ADMITTED):
            run(job)
            assert_within_parallelism(array_id, 8)
        most_running = max(most_running, Job.objects.filter(array_id=array_id, state=S.RUNNING).count())
        # End one running element per step, so passes interleave with ends.
        job = Job.objects.filter(array_id=array_id, state=S.RUNNING).order_by("array_index").first()
        if job is not None:
            end_attempt(job, job.current_attempt, S.SUCCEEDED, reason="done", end_reason="Succeeded", exit_code=0)
        assert_within_parallelism(array_id, 8)
        assert passes < 500
    assert most_running == 8  # the roomy pool runs as many as the parallelism allows
    assert sorted(Job.objects.filter(array_id=array_id).values_list("array_index", flat=True)) == list(range(50))
    body = teammate.client.get(f"{ARRAYS}{array_id}/").json()
    assert body["status"] == "succeeded" and body["counts"]["succeeded"] == 50 and body["materialized"] == 50


def test_roll_ups_give_running_failed_and_the_ledger_cost(teammate, roomy):
    array_id = teammate.client.post(ARRAYS, array_body({"count": 4, "parallelism": 4}), format="json").json()["id"]
    schedule_pending()
    for job in Job.objects.filter(array_id=array_id):
        run(job)
    body = teammate.client.get(f"{ARRAYS}{array_id}/").json()
    assert body["status"] == "running" and body["counts"]["running"] == 4
    start = timezone.now() - dt.timedelta(hours=1)
    amounts = [Decimal("1.25"), Decimal("2.50"), Decimal("0.125"), Decimal("3.00")]
    for job, amount in zip(Job.objects.filter(array_id=array_id).order_by("array_index"), amounts, strict=True):
        make_cost_entry(job.current_attempt, start, dt.timedelta(minutes=10), amount, usd_per_gpu_hour="2.00")
    _finish_admitted(array_id, lambda i: S.FAILED if i == 2 else S.SUCCEEDED)
    body = teammate.client.get(f"{ARRAYS}{array_id}/").json()
    assert body["status"] == "failed"
    assert (body["counts"]["succeeded"], body["counts"]["failed"]) == (3, 1)
    assert body["cost_usd"] == "6.88"  # 1.25 + 2.50 + 0.125 + 3.00 = 6.875, to cents half to even
    listed = teammate.client.get(ARRAYS).json()["results"][0]
    assert (listed["status"], listed["cost_usd"], listed["counts"]) == ("failed", "6.88", body["counts"])


def test_a_cancel_stops_running_elements_and_every_one_not_yet_made(teammate, roomy, settings):
    settings.ARRAY_QUEUED_WINDOW = 4
    array_id = teammate.client.post(ARRAYS, array_body({"count": 50, "parallelism": 8}), format="json").json()["id"]
    for _ in range(3):
        schedule_pending()
        for job in Job.objects.filter(array_id=array_id, state=S.ADMITTED):
            run(job)
    assert Job.objects.filter(array_id=array_id, state=S.RUNNING).count() == 8
    made = JobArray.objects.get(pk=array_id).materialized
    assert made < 50

    r = teammate.client.post(f"{ARRAYS}{array_id}/cancel/")

    assert r.status_code == 200, r.content
    assert r.json()["status"] == "cancelling"
    assert Job.objects.filter(array_id=array_id, state=S.CANCELLING).count() == 8
    assert not Job.objects.filter(array_id=array_id, state__in=(S.QUEUED, S.RUNNING, S.ADMITTED)).exists()
    for job in Job.objects.filter(array_id=array_id, state=S.CANCELLING):
        assert JobEvent.objects.filter(job=job, to_state=S.CANCELLING, actor=teammate.user).exists()
        finish_cancel(job.pk)  # the cluster (none answers here) confirms: cancelled, deletion pending
    for _ in range(3):
        schedule_pending()
    array = JobArray.objects.get(pk=array_id)
    assert array.materialized == made and Job.objects.filter(array_id=array_id).count() == made
    body = teammate.client.get(f"{ARRAYS}{array_id}/").json()
    assert body["status"] == "cancelled" and body["counts"]["cancelled"] == 50
    assert teammate.client.post(f"{ARRAYS}{array_id}/cancel/").status_code == 409


def test_an_element_cancelled_with_its_deletion_pending_keeps_its_slot_until_its_pods_are_gone(teammate, roomy):
    array_id = teammate.client.post(ARRAYS, array_body({"count": 3, "parallelism": 2}), format="json").json()["id"]
    schedule_pending()
    for job in Job.objects.filter(array_id=array_id, state=S.ADMITTED):
        run(job)
    first = Job.objects.get(array_id=array_id, array_index=0)
    cancel_job(first)
    finish_cancel(first.pk)  # the cluster (none answers here) cannot confirm: cancelled, deletion pending
    first.refresh_from_db()
    assert first.state == S.CANCELLED and first.current_attempt.deletion_pending_since is not None
    shown = teammate.client.get(f"/api/v1/jobs/{first.pk}/attempts/").json()["results"][0]
    assert shown["end_reason"] == "Cancelled" and shown["deletion_pending_since"] is not None
    for _ in range(3):
        schedule_pending()
    assert sorted(Job.objects.filter(array_id=array_id).values_list("array_index", flat=True)) == [0, 1]

    JobAttempt.objects.filter(pk=first.current_attempt_id).update(deletion_pending_since=None)  # a look found none
    schedule_pending()

    assert sorted(Job.objects.filter(array_id=array_id).values_list("array_index", flat=True)) == [0, 1, 2]
    assert Job.objects.get(array_id=array_id, array_index=2).state == S.ADMITTED


def test_the_elements_list_is_paginated_by_index_and_filters_by_state(teammate, roomy):
    array_id = teammate.client.post(ARRAYS, array_body({"count": 5, "parallelism": 5}), format="json").json()["id"]
    schedule_pending()
    run(Job.objects.get(array_id=array_id, array_index=3))
    page = teammate.client.get(f"{ARRAYS}{array_id}/elements/?limit=2").json()
    assert page["count"] == 5 and [j["array_index"] for j in page["results"]] == [0, 1]
    assert page["results"][0]["array"] == array_id
    running = teammate.client.get(f"{ARRAYS}{array_id}/elements/?state=running").json()["results"]
    assert [j["array_index"] for j in running] == [3]
    assert teammate.client.get(f"{ARRAYS}{array_id}/elements/?state=nope").status_code == 400


def test_the_sweep_example_submits_as_a_six_element_grid(teammate, cluster_factory, h100):
    import yaml
    from django.conf import settings as django_settings

    cluster_factory("any", "aws", "us-east-1", h100, nodes=2, gpus_per_node=8, price="2.00")
    document = yaml.safe_load((django_settings.BASE_DIR / "examples" / "jobs" / "sweep-gpt.yaml").read_text())
    document["team"] = "alpha"
    r = teammate.client.generic(
        "POST", ARRAYS, yaml.safe_dump(document, sort_keys=False), content_type="application/yaml"
    )
    assert r.status_code == 201, r.content
    assert (r.json()["count"], r.json()["parallelism"], list(r.json()["grid"])) == (6, 2, ["lr", "batch_size"])
    assert array_env(r.json()["id"], 3, 6, JobArray.objects.get(pk=r.json()["id"]).grid)["SWEEP_LR"] == "0.006"


def test_the_job_list_filters_by_array_and_refuses_ids_that_are_not_whole_numbers(teammate, roomy):
    first = teammate.client.post(ARRAYS, array_body({"count": 3, "parallelism": 3}), format="json").json()["id"]
    second = teammate.client.post(ARRAYS, array_body({"count": 2, "parallelism": 2}), format="json").json()["id"]
    schedule_pending()
    single = copy.deepcopy(array_body({"count": 1}))
    single.pop("array")
    assert teammate.client.post("/api/v1/jobs/", single, format="json").status_code == 201
    for array_id, count in ((first, 3), (second, 2)):
        listed = teammate.client.get(f"/api/v1/jobs/?array={array_id}&limit=50").json()["results"]
        assert sorted(j["array_index"] for j in listed) == list(range(count))
        assert {j["array"] for j in listed} == {array_id}
    for bad in ("1.5", "0", "-3", "x", str(2**63)):
        r = teammate.client.get(f"/api/v1/jobs/?array={bad}")
        assert r.status_code == 400 and "array" in r.json(), (bad, r.content)
    page = signed_in(teammate).get("/jobs/", {"array": first})
    assert page.status_code == 200 and f'name="array" value="{first}"' in page.content.decode()
