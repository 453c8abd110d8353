"""Submitting a multi-role job (``kind: multi-role``, ``spec.roles``; ADR 0039): the example GRPO job is accepted as
written, the job's columns and preview count the sum of its roles, and every bad role answers 400 keyed by its
field path (``spec.roles.<name>.<field>``), storing nothing. The roles' order is their names' order everywhere,
on PostgreSQL (whose jsonb orders an object's keys by length, then bytes) as on SQLite (which keeps them as
written): roles written as ``rollout``, ``rm``, ``learner`` (jsonb stores ``rm``, ``learner``, ``rollout``) are
``learner``, ``rm``, ``rollout`` in the answer, in admission and in both runners' numbering of pods.

The fleet: aws-use1's H100 pool (a cluster of the local runner, 2 nodes x 8 GPUs, 6.88 USD/GPU-h) and gcp-usc1's CPU pool (4 nodes x 16 cores,
64 GiB); alpha has 32 H100 GPUs of quota.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.utils import timezone

from costs.collection import attempt_roles
from jobs.models import Job, JobAttempt
from jobs.roles import role_pods
from jobs.scheduling.passes import try_admit
from jobs.scheduling.snapshot import queued_job, role_shapes
from runners.kubernetes.runner import role_shapes as attempt_role_shapes
from runners.kubernetes.runner import roles_of
from runners.local.runner import role_layout
from runners.models import Node
from tests.support.factories import make_cluster

JOBS = "/api/v1/jobs/"
EXAMPLE = Path(settings.BASE_DIR) / "examples" / "jobs" / "rl-grpo.yaml"


def role(gpus: int = 1, nodes: int = 1, **extra) -> dict:
    return {"image": "python:3.11", "command": ["python", "rl.py"],
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": gpus, "nodes": nodes}, **extra}


def body(**roles) -> dict:
    roles = roles or {"learner": role(4), "rollout": role(2, nodes=2, port=8000, completion=False)}
    return {"team": "alpha", "name": "grpo", "kind": "multi-role",
            "spec": {"roles": roles, "max_runtime_seconds": 3600}}


@pytest.fixture
def fleet(catalog, cpu, alpha_h100_quota):
    """aws-use1 (backend local: its runner starts multi-role jobs) with its 2 H100 nodes synced."""
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=2, gpus_per_node=8,
                                 backend="local")
    for i in range(2):
        Node.objects.create(cluster=cluster, node_pool=pool, name=f"h100-{i}", gpus=8, cpu_milli=96000,
                            memory_mib=1024 * 1024, seen_at=timezone.now())
    return pool


def test_the_example_grpo_job_is_accepted_as_written(teammate, fleet):
    document = yaml.safe_load(EXAMPLE.read_text())
    document["team"] = "alpha"

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert job.kind == "multi-role" and list(job.spec["roles"]) == ["learner", "rollout"]
    assert (job.accelerator.name, job.nodes, job.total_gpus) == ("CPU", 3, 0)
    assert job.spec["roles"]["rollout"]["port"] == 8000 and job.spec["roles"]["rollout"]["completion"] is False
    assert job.spec["roles"]["learner"]["completion"] is True


def test_the_columns_and_the_preview_count_the_sum_of_the_roles(teammate, fleet):
    r = teammate.client.post(f"{JOBS}preview/", body(), format="json")
    assert r.status_code == 200, r.content
    preview = r.json()
    # 4 + 2 x 2 = 8 GPUs; 8 x 6.88 USD/GPU-h x 1 h = 55.04
    assert preview["total_gpus"] == 8 and preview["estimated_cost_usd"] == "55.04"
    assert preview["fits_now"] is True and preview["outcome"] == "admit"

    r = teammate.client.post(JOBS, body(), format="json")
    assert r.status_code == 201, r.content
    answer = r.json()
    assert (answer["total_gpus"], answer["nodes"], answer["gpus_per_node"]) == (8, 3, 4)


def test_a_gang_with_no_room_now_is_previewed_as_waiting_and_names_the_role(teammate, fleet):
    # each role fits a node alone; the learner cannot fit beside the rollouts' 2 x 4 GPUs
    r = teammate.client.post(f"{JOBS}preview/", body(learner=role(8), rollout=role(4, nodes=2, port=8000,
                                                                                  completion=False)), format="json")
    assert r.status_code == 200, r.content
    preview = r.json()
    assert preview["fits_now"] is False and preview["outcome"] == "wait"
    assert preview["capacity"]["message"].startswith("Role learner cannot be placed with the job's other roles")


BAD = [
    ("bad-role-name", lambda b: b["spec"]["roles"].update({"Learner": role()}), "spec.roles.Learner",
     "invalid role name"),
    ("long-role-name", lambda b: b["spec"]["roles"].update({"a" * 13: role()}), f"spec.roles.{'a' * 13}",
     "at most 12 characters"),
    ("string-gpus", lambda b: b["spec"]["roles"]["learner"]["resources"].update(gpus_per_node="1"),
     "spec.roles.learner.resources.gpus_per_node", "A valid integer is required."),
    ("no-roles", lambda b: b["spec"].update(roles={}), "spec.roles", "at least 1 item"),
    ("roles-missing", lambda b: b["spec"].pop("roles"), "spec.roles", "required for a multi-role job"),
    ("roles-on-training", lambda b: b.update(kind="training"), "spec.roles", "multi-role jobs only"),
    ("two-accelerators", lambda b: b["spec"]["roles"]["rollout"].update(
        resources={"accelerator": "CPU", "gpus_per_node": 0, "nodes": 1, "cpu": 1}),
     "spec.roles.rollout.resources.accelerator", "every role of a multi-role job runs on one accelerator"),
    ("no-completion", lambda b: b["spec"]["roles"]["learner"].update(completion=False), "spec.roles",
     "at least one role must have completion: true"),
    ("preemptible", lambda b: b["spec"].update(preemptible=True), "spec.preemptible", "neither preempted nor"),
    ("no-command", lambda b: b["spec"]["roles"]["learner"].pop("command"), "spec.roles.learner.command",
     "required unless args are given"),
    ("unknown-key", lambda b: b["spec"]["roles"]["learner"].update(replicas=2), "spec.roles.learner.replicas",
     "unknown field; expected one of image, command, args, env, resources, port, completion"),
    ("unknown-spec-key", lambda b: b["spec"].update(image="python:3.11"), "spec.image",
     "unknown field; expected one of roles,"),
    ("bad-port", lambda b: b["spec"]["roles"]["rollout"].update(port=70000), "spec.roles.rollout.port",
     "less than or equal to 65535"),
    ("completion-not-bool", lambda b: b["spec"]["roles"]["rollout"].update(completion="no"),
     "spec.roles.rollout.completion", "Must be a valid boolean."),
    ("alternatives", lambda b: b["spec"]["roles"]["learner"]["resources"].update(alternatives=["A100-80GB"]),
     "spec.roles.learner.resources.alternatives", "no alternatives"),
    ("too-many-nodes", lambda b: b["spec"]["roles"]["rollout"]["resources"].update(nodes=3),
     "spec.roles.rollout.resources.nodes", "3 nodes is more than any H100-80GB node pool has"),
    ("too-many-gpus", lambda b: b["spec"]["roles"]["learner"]["resources"].update(gpus_per_node=9),
     "spec.roles.learner.resources.gpus_per_node", "9 GPUs per node is more than any"),
    ("no-runtime", lambda b: b["spec"].pop("max_runtime_seconds"), "spec.max_runtime_seconds",
     "This field is required."),
    ("roles-not-a-mapping", lambda b: b["spec"].update(roles=["learner"]), "spec.roles", "dictionary"),
    # pod 1 of role rollout on Kubernetes is <attempt>-rollout-1-<5 random characters>, and pod 0 of a role
    # rollout-1 <attempt>-rollout-1-0-<5>: a random suffix that starts with a digit reads as the other role's
    ("role-name-a-pod-name-prefix", lambda b: b["spec"]["roles"].update({"rollout-1": role(1)}),
     "spec.roles.rollout-1", "role rollout-1 is role rollout's name, '-' and a digit"),
    ("role-name-a-pod-name-prefix-longer", lambda b: b["spec"]["roles"].update({"learner-0-b": role(1)}),
     "spec.roles.learner-0-b", "role learner-0-b is role learner's name, '-' and a digit"),
]


@pytest.mark.parametrize("change, field, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_multi_role_submission_is_400_on_its_field(teammate, fleet, change, field, message):
    document = copy.deepcopy(body())
    change(document)

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 400, r.content
    errors = r.json()
    assert field in errors, errors
    assert any(message in m for m in errors[field]), errors
    assert not Job.objects.exists()


# --- the roles' order ---------------------------------------------------------------------------------------------

SUBMITTED = ["rollout", "rm", "learner"]
NAME_ORDER = sorted(SUBMITTED)  # learner, rm, rollout


def unordered() -> dict:
    """``body()`` with roles written in neither name order nor jsonb's (length, then bytes)."""
    document = body(rollout=role(2, nodes=2, port=8000, completion=False), rm=role(1, port=9000, completion=False),
                    learner=role(4))
    assert list(document["spec"]["roles"]) == SUBMITTED
    return document


def test_the_api_answers_the_roles_in_name_order_when_submitted_and_when_read(teammate, fleet):
    r = teammate.client.post(JOBS, unordered(), format="json")
    assert r.status_code == 201, r.content
    submitted = r.json()
    read = teammate.client.get(f"{JOBS}{submitted['id']}/").json()

    for answer in (submitted, read):
        assert list(answer["roles"]) == NAME_ORDER
        assert list(answer["spec"]["roles"]) == NAME_ORDER


def test_admission_and_both_runners_number_the_roles_in_name_order(teammate, fleet):
    r = teammate.client.post(JOBS, unordered(), format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])

    assert [s.name for s in role_shapes(job.spec["roles"])] == NAME_ORDER
    assert [s.name for s in queued_job(job).roles] == NAME_ORDER
    assert try_admit(job.pk) == "admitted"
    attempt = JobAttempt.objects.get(job=job)
    assert [name for name, _ in attempt_role_shapes(attempt.placement)] == NAME_ORDER
    assert list(attempt_roles(attempt)) == NAME_ORDER
    # the runners number the pods role by role in the same order: learner 0, rm 1, rollout 2 and 3
    pods = [("learner", 0), ("rm", 0), ("rollout", 0), ("rollout", 1)]
    assert role_pods(job.spec) == pods
    layout = role_layout(job.spec)
    assert [(r["name"], r["first"], r["count"]) for r in layout] == [("learner", 0, 1), ("rm", 1, 1), ("rollout", 2, 2)]
    assert [r.name for r in roles_of(job.spec, attempt.placement)] == NAME_ORDER


# --- a gang that can never run as a whole -------------------------------------------------------------------------


def test_roles_that_fit_alone_but_never_together_on_any_pool_are_refused_on_roles(teammate, fleet):
    # each role fits the 2-node x 8-GPU pool alone; together they ask 8 + 2 x 8 = 24 GPUs of its 16
    document = body(learner=role(8), rollout=role(8, nodes=2, port=8000, completion=False))

    for url in (f"{JOBS}preview/", JOBS):
        r = teammate.client.post(url, document, format="json")
        assert r.status_code == 400, r.content
        assert r.json() == {"spec.roles": [
            "the roles ask 24 H100-80GB GPUs together (learner 1 x 8, rollout 2 x 8), more than any node pool the "
            "job may use has (the largest has 16): admitted together or not at all, they could never run"]}
    assert not Job.objects.exists()


def test_roles_over_the_teams_quota_together_are_refused_on_roles(teammate, catalog, cpu, alpha_h100_quota):
    # a pool of 8 nodes x 8 GPUs holds them; alpha reaches 32 H100 GPUs and the roles ask 4 x 8 + 1 x 8 = 40
    cluster, pool = make_cluster("aws-use1", "aws", "us-east-1", catalog["H100-80GB"], nodes=8, gpus_per_node=8,
                                 backend="local")
    document = body(learner=role(8, nodes=4), rollout=role(8, port=8000, completion=False))

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 400, r.content
    assert list(r.json()) == ["spec.roles"]
    assert r.json()["spec.roles"][0].startswith("the roles ask 40 H100-80GB GPUs together (learner 4 x 8, rollout "
                                                "1 x 8), over the 32 team alpha can reach")
    assert not Job.objects.exists()


def test_a_long_bad_role_name_is_shown_cut_in_its_path_and_its_message(teammate, fleet):
    document = body()
    document["spec"]["roles"]["a" * 5000] = role()

    r = teammate.client.post(JOBS, document, format="json")

    assert r.status_code == 400, r.content
    assert r.json() == {f"spec.roles.{'a' * 109}...": [
        f'invalid role name "{"a" * 120}...": a role name must be a DNS-1123 label of at most 12 characters '
        f"(lowercase letters, digits and '-', starting and ending with a letter or digit; it names the role's "
        f"Kubernetes objects)"]}
    assert not Job.objects.exists()
