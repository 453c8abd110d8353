"""URLconf of benchmarks/submit.py: the platform's URLs plus a bare create of a Job row, the baseline.

The baseline goes through the same stack as the real endpoint (middleware,
DRF token authentication, JSON parsing, the job's JSON representation in
the answer) but inserts the row with no validation, no event and no
scheduling pass, so the difference is what admission costs.
"""

from django.urls import include, path
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.serializers import JobSerializer
from jobs.models import Job
from quotas.models import Team
from runners.models import Accelerator


class BareCreate(APIView):
    """Insert the Job row a submission would create, and nothing else."""

    def post(self, request):
        body = request.data
        spec = body["spec"]
        res = spec["resources"]
        job = Job.objects.create(
            team=Team.objects.get(slug=body["team"]), submitter=request.user, name=body["name"], kind=body["kind"],
            spec=spec, accelerator=Accelerator.objects.get(name=res["accelerator"]), gpus_per_node=res["gpus_per_node"],
            nodes=res["nodes"], max_runtime_seconds=spec["max_runtime_seconds"],
        )
        return Response(JobSerializer(job, context={"request": request}).data, status=status.HTTP_201_CREATED)


urlpatterns = [
    path("bench/bare-jobs/", BareCreate.as_view()),
    path("", include("controlplane.urls")),
]
