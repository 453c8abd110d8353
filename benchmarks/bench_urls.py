"""URLconf of benchmarks/submit.py: the platform's URLs plus a bare create of a Job row, the baseline.

The baseline goes through the same stack as the real endpoint (middleware,
DRF token authentication, JSON parsing, the job's JSON representation in
the answer) but inserts the row with no validation, no event and no
scheduling pass, so the difference is what admission costs. Its team and
accelerator come from a per-process cache like the real endpoint's
(``controlplane.lookups``), so both do one INSERT round trip per job. The
row is stored CANCELLED (the only column that differs): a QUEUED row nobody
submitted would be read and placed by the admission phase's scheduling
passes, charging the baseline's rows to admission.
"""

from django.urls import include, path
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.lookups import LookupCache
from jobs.api.serializers import JobSerializer
from jobs.models import Job, JobState
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


urlpatterns = [
    path("bench/bare-jobs/", BareCreate.as_view()),
    path("", include("controlplane.urls")),
]
