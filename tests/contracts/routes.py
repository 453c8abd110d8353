"""The API's routes as the DRF router knows them (``controlplane.urls.api_router()``), not as a list written by hand,
and the sample objects and bodies the contract tests call them with.

Each ``Route`` is one (HTTP method, URL pattern) of the router: a list route, a detail route or an extra action.
What each resource is (team-scoped, platform-wide, an aggregate) and who may write it is written here from
docs/design.md (Interfaces) and the README, independently of the views; ``test_every_route_is_classified`` fails
when a route appears that this file does not know yet.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt

from django.utils import timezone

from controlplane.urls import api_router
from costs.models import Price
from costs.reports.build import generate_report
from jobs.arrays import submit_array
from jobs.spec import validated_submission
from notifications.models import Event, Notification, Subscription
from quotas.audit import record, snapshot
from quotas.changes import request_change
from quotas.models import Cohort, CohortQuota, PriorityClass
from runners.models import Node
from tests.support.factories import VALID_SPEC

#: A user sees only their teams' objects: another team's object is a 404, not a 403 (docs/design.md, Interfaces).
#: The audit trail (ADR 0031) is read like a team's objects: a record of another team, or of the platform's own
#: objects, is staff's only.
TEAM_SCOPED = {"jobs", "arrays", "teams", "quotas", "budgets", "budget-status", "reports", "change-requests", "audit",
               "subscriptions", "notifications"}
#: The fleet and the platform's settings: every authenticated user reads them.
PLATFORM_WIDE = {"accelerators", "clusters", "node-pools", "nodes", "prices", "cohorts", "cohort-quotas", "cohort-trees",
                 "priority-classes"}
#: Aggregates over the user's teams' ledger and samples (fair-sharing: their decayed usage, ADR 0045): lists only.
AGGREGATES = {"costs", "utilization", "capacity", "fair-sharing"}
#: Written by platform staff only; anyone else is refused before any lookup (403, whatever the object).
STAFF_WRITES = {"teams", "cohorts", "cohort-quotas", "priority-classes", "clusters", "nodes"}
#: A team's objects written by platform staff only (ADR 0029): any member of the team, its admins included, gets
#: 403 on one it sees and outsiders 404; a create by anyone but staff is a 403 before its body is read.
STAFF_WRITES_OF_TEAM_OBJECTS = {"quotas", "budgets"}
#: Requested by the team's admins (members and viewers get 403; the team is a field of the request, so another
#: team's is refused on it, 400); decided by staff and withdrawn by the requester (403 for others who see it, 404
#: for outsiders).
TEAM_ADMIN_REQUESTS = {"change-requests"}
#: A team's notification subscriptions are written by its admins and staff (docs/adr/0035): members and viewers
#: who see one get 403; a create names the team as a field, so another team's is refused on it (400); a body
#: without a team is the user's own subscription, which anyone may make.
TEAM_ADMIN_WRITES = {"subscriptions"}
#: Built on demand by any member of the team (viewers too: a report shows what costs/ shows them) and staff; the
#: team is a field of the request, so another team's is refused on it (400), like an unknown team.
MEMBER_BUILDS = {"reports"}

WRITE_METHODS = {"post", "put", "patch", "delete"}
MISSING = {"pk": 999999999, "slug": "no-such-team"}


@dataclasses.dataclass(frozen=True)
class Route:
    """One HTTP method of one router URL: ``prefix`` (``jobs``), ``action`` (``list``, ``retrieve``, ``cancel``...),
    ``detail`` (has a lookup), ``lookup`` (``pk`` or ``slug``), ``template`` (``/api/v1/jobs/{lookup}/cancel/``)."""

    prefix: str
    method: str
    action: str
    detail: bool
    lookup: str
    template: str
    http_method_names: tuple

    @property
    def id(self) -> str:
        return f"{self.method.upper()} {self.template}"

    @property
    def served(self) -> bool:
        """Whether the view answers this method at all (a router may map one the view refuses with 405)."""
        return self.method in self.http_method_names

    @property
    def writes(self) -> bool:
        return self.method in WRITE_METHODS

    def url(self, lookup=None) -> str:
        return self.template.format(lookup=lookup)


def api_routes() -> list[Route]:
    """Every (method, URL) the ``/api/v1/`` router serves, from its registry, in registration order."""
    router = api_router()
    routes = []
    for prefix, viewset, _basename in router.registry:
        lookup = getattr(viewset, "lookup_field", "pk")
        for route in router.get_routes(viewset):
            # "^{prefix}/{lookup}/cancel{trailing_slash}$" -> "/api/v1/jobs/{lookup}/cancel/"
            template = "/api/v1/" + route.url.lstrip("^").rstrip("$").replace("{prefix}", prefix).replace(
                "{trailing_slash}", "/")
            for method, action in route.mapping.items():
                if not hasattr(viewset, action):
                    continue
                routes.append(Route(prefix, method, action, route.detail, lookup, template,
                                    tuple(viewset.http_method_names)))
    return routes


ROUTES = api_routes()


def world(teams, owner, teammate, outsider, aws_cluster, alpha_objects, beta_objects, h100) -> dict:
    """Team alpha's object (or the platform's) behind every detail route, by prefix: the lookup value."""
    now = timezone.now()
    report, _ = generate_report(teams[0], now - dt.timedelta(days=1), now)
    generate_report(teams[1], now - dt.timedelta(days=1), now)
    cohort = Cohort.objects.create(name="research")
    spare = PriorityClass.objects.create(name="spare", value=300)
    array = submit_array(**validated_submission(submission(), teammate.user), count=3, parallelism=2, grid=[])
    node, _ = [Node.objects.create(cluster=aws_cluster["cluster"], node_pool=aws_cluster["pool"], name=f"ip-10-0-0-{i}",
                                   gpus=8, cpu_milli=64_000, memory_mib=512 * 1024, seen_at=now)
               for i in (1, 2)]  # the pool's 2 nodes, as a sync records them
    change = request_change(user=owner.user, team=teams[0], kind="quota", target_id=alpha_objects["quota"].pk,
                            payload={"nominal_gpus": 24}, reason="a second training run")
    quota = alpha_objects["quota"]
    audited = record(None, "updated", quota, snapshot(quota), snapshot(quota), "a sample record of alpha's quota")
    subscription = Subscription.objects.create(team=teams[0], channel="webhook", events=[Event.JOB_FAILED],
                                               webhook_url="https://hooks.example.com/services/T0/B0/alpha")
    notification = Notification.objects.create(
        subscription=subscription, source="job_event", source_id=1, event=Event.JOB_FAILED, team=teams[0],
        job=alpha_objects["job"], subject="alpha-job failed", payload={"text": "alpha-job failed"}, next_attempt_at=now)
    return {
        "audit": audited.pk,
        "subscriptions": subscription.pk,
        "notifications": notification.pk,
        "change-requests": change.pk,
        "jobs": alpha_objects["job"].pk,
        "arrays": array.pk,
        "teams": "alpha",
        "quotas": alpha_objects["quota"].pk,
        "budgets": alpha_objects["budget"].pk,
        "budget-status": alpha_objects["budget"].pk,
        "reports": report.pk,
        "accelerators": h100.pk,
        "clusters": aws_cluster["cluster"].pk,
        "node-pools": aws_cluster["pool"].pk,
        "nodes": node.pk,
        "prices": Price.objects.filter(accelerator=h100).first().pk,
        "cohorts": cohort.pk,
        "cohort-quotas": CohortQuota.objects.create(cohort=cohort, accelerator=h100, nominal_gpus=4).pk,
        "cohort-trees": cohort.pk,
        "priority-classes": spare.pk,
    }


def submission() -> dict:
    return {"team": "alpha", "name": "train-small", "kind": "training", "spec": copy.deepcopy(VALID_SPEC)}


def pipeline_submission() -> dict:
    """A submission that runs after alpha's QUEUED job ``alpha-job`` (``world``) succeeds: ``after`` by name."""
    return {**submission(), "after": [{"job": "alpha-job", "condition": "succeeded"}]}


def multi_role_submission() -> dict:
    """A multi-role job (ADR 0039): a learner and a rollout server on the world's H100 pool."""
    role = {"image": "python:3.11", "command": ["python", "examples/rl_grpo.py"], "env": {"PYTHONUNBUFFERED": "1"},
            "resources": {"accelerator": "H100-80GB", "gpus_per_node": 1, "nodes": 1}}
    return {"team": "alpha", "name": "rl-grpo", "kind": "multi-role",
            "spec": {"roles": {"learner": copy.deepcopy(role), "rollout": {**copy.deepcopy(role), "port": 8000,
                                                                           "completion": False}},
                     "max_runtime_seconds": 600}}


#: Further valid bodies of some routes, each held to the same contracts as the route's ``VALID_BODIES`` one.
MORE_BODIES = {
    ("jobs", "create"): [multi_role_submission],
    ("jobs", "preview"): [multi_role_submission],
}


#: A valid body for every writable (prefix, action), accepted from staff: the contract tests break one part of it
#: at a time, so a 400 is the answer to that part alone.
VALID_BODIES = {
    ("jobs", "create"): pipeline_submission,
    ("jobs", "preview"): submission,
    ("jobs", "resubmit"): lambda: {"name": "train-again"},
    ("jobs", "rollout"): lambda: {"checkpoint_from_job": 1},
    ("arrays", "create"): lambda: {**submission(), "array": {"grid": {"lr": [0.1, 0.01], "batch": [16, 32]},
                                                             "parallelism": 2}},
    ("quotas", "create"): lambda: {"team": "alpha", "accelerator": "A100-80GB", "nominal_gpus": 8},
    ("quotas", "update"): lambda: {"team": "alpha", "accelerator": "H100-80GB", "nominal_gpus": 8},
    ("quotas", "partial_update"): lambda: {"nominal_gpus": 8},
    ("budgets", "create"): lambda: {"team": "alpha", "amount_usd": "10.00"},
    ("budgets", "update"): lambda: {"team": "alpha", "amount_usd": "10.00"},
    ("budgets", "partial_update"): lambda: {"amount_usd": "10.00"},
    ("teams", "partial_update"): lambda: {"weight": "2"},
    ("cohorts", "create"): lambda: {"name": "vision"},
    ("cohorts", "update"): lambda: {"name": "speech"},
    ("cohorts", "partial_update"): lambda: {"name": "speech"},
    ("cohort-quotas", "create"): lambda: {"cohort": "research", "accelerator": "A100-80GB", "nominal_gpus": 8},
    ("cohort-quotas", "update"): lambda: {"cohort": "research", "accelerator": "H100-80GB", "nominal_gpus": 8},
    ("cohort-quotas", "partial_update"): lambda: {"nominal_gpus": 8},
    ("priority-classes", "create"): lambda: {"name": "urgent", "value": 2000},
    ("priority-classes", "update"): lambda: {"name": "spare", "value": 301},
    ("priority-classes", "partial_update"): lambda: {"value": 301},
    ("clusters", "create"): lambda: {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1",
                                     "backend": "kubernetes"},
    ("clusters", "update"): lambda: {"name": "aws-use1", "provider": "aws", "region": "us-east-2",
                                     "backend": "kubernetes"},
    ("clusters", "partial_update"): lambda: {"region": "us-east-2"},
    ("nodes", "cordon"): lambda: {"note": "reseating GPU 3"},
    ("nodes", "drain"): lambda: {"note": "replacing GPU 3"},
    ("nodes", "uncordon"): lambda: {},
    ("nodes", "clear"): lambda: {},
    ("change-requests", "create"): lambda: {"team": "alpha", "kind": "budget", "payload": {"amount_usd": "20.00"},
                                            "reason": "a budget for the evaluation runs"},
    ("change-requests", "approve"): lambda: {"note": "fits the fleet"},
    ("change-requests", "decline"): lambda: {"note": "no spare H100s this quarter"},
    ("change-requests", "withdraw"): lambda: {},
    ("subscriptions", "create"): lambda: {"team": "alpha", "channel": "webhook", "events": ["job.failed"],
                                          "webhook_url": "https://hooks.example.com/services/T0/B0/new"},
    ("subscriptions", "update"): lambda: {"channel": "webhook", "events": ["job.failed", "budget.threshold"],
                                          "webhook_url": "https://hooks.example.com/services/T0/B0/other"},
    ("subscriptions", "partial_update"): lambda: {"events": ["job.succeeded"]},
    ("reports", "create"): lambda: {"team": "alpha", "start": "2026-03-10T00:00:00Z", "end": "2026-03-11T00:00:00Z"},
}
