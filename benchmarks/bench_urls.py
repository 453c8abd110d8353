"""URLconf of benchmarks/submit.py: the platform's URLs plus three baselines without admission.

``bench/floor/`` is the stack's floor: a plain Django view behind the same
middleware that reads the body and answers 201 with a small JSON document,
touching no database, authentication or serializer. Its CPU per request is
the least any submission served by this stack (gunicorn, Django) can cost.

``bench/bare-jobs/`` is a bare create of a Job row. ``bench/validated-jobs/``
is the real submission without admission: the endpoint's own validation
(``jobs.spec.validated_submission``) and rows (``jobs.lifecycle.store_submitted_job``:
the job and its ``submitted`` event), and no scheduling pass.

Bare create:

The baseline goes through the same stack as the real endpoint (middleware,
DRF token authentication, JSON parsing, the job's JSON representation in
the answer) but inserts the row with no validation, no event and no
scheduling pass, so the difference is what admission costs. Its team and
accelerator come from a per-process cache like the real endpoint's
(``core.lookups``), so both do one INSERT round trip per job. The
row is stored CANCELLED (the only column that differs): a QUEUED row nobody
submitted would be read and placed by the admission phase's scheduling
passes, charging the baseline's rows to admission.
"""

from django.http import JsonResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.lookups import LookupCache
from jobs.api.serializers import JobSerializer
from jobs.lifecycle import store_submitted_job
from jobs.models import Job, JobState
from jobs.spec import validated_submission
from quotas.models import Team
from runners.models import Accelerator

ROWS = LookupCache("bench-bare-rows")


class BareCreate(APIView):
    """Insert the Job row a submission would create, and nothing else."""

    def post(self, request):
        body = request.data
        spec = body["spec"]
        res = spec["resources"]
        team = ROWS.get(("team", body["team"]), lambda: Team.objects.get(slug=body["team"]))
        accelerator = ROWS.get(("accelerator", res["accelerator"]), lambda: Accelerator.objects.get(name=res["accelerator"]))
        job = Job.objects.create(
            team=team, submitter=request.user, name=body["name"], kind=body["kind"], state=JobState.CANCELLED,
            spec=spec, accelerator=accelerator, gpus_per_node=res["gpus_per_node"],
            nodes=res["nodes"], max_runtime_seconds=spec["max_runtime_seconds"],
        )
        return Response(JobSerializer(job, context={"request": request}).data, status=status.HTTP_201_CREATED)


class ValidatedCreate(APIView):
    """``POST /api/v1/jobs/`` without admission: the same validation, job row and event, no scheduling pass.

    Its rows are QUEUED like real submissions, but no pass is published for them. A pass would read them,
    so ``benchmarks/submit.py`` cancels every QUEUED row before each phase.
    """

    def post(self, request):
        job = store_submitted_job(**validated_submission(request.data, request.user))  # the endpoint's own
        location = request.build_absolute_uri(f"/api/v1/jobs/{job.pk}/")
        return Response(JobSerializer(job, context={"request": request}).data, status=status.HTTP_201_CREATED,
                        headers={"Location": location})


@csrf_exempt
def floor(request):
    """Read the posted body and answer 201 with a constant JSON document: the stack's cost per request."""
    request.body  # noqa: B018 - read like the real endpoint reads it
    return JsonResponse({"id": 0, "state": "QUEUED"}, status=201)


urlpatterns = [
    path("bench/floor/", floor),
    path("bench/bare-jobs/", BareCreate.as_view()),
    path("bench/validated-jobs/", ValidatedCreate.as_view()),
    path("", include("controlplane.urls")),
]
