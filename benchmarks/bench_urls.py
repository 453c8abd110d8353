"""URLconf of benchmarks/submit.py: the platform's URLs plus a bare create of a Job row, the baseline."""

import json

from django.http import HttpResponse, JsonResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from jobs.models import Job
from quotas.models import ApiToken, Team
from runners.models import Accelerator


@csrf_exempt
def bare_create(request):
    """Authenticate the token and insert the same Job row as a submission, with no validation or admission."""
    key = request.headers.get("Authorization", "").removeprefix("Token ")
    token = ApiToken.objects.select_related("user").filter(digest=ApiToken.hash_key(key)).first()
    if token is None:
        return HttpResponse(status=401)
    body = json.loads(request.body)
    spec = body["spec"]
    res = spec["resources"]
    job = Job.objects.create(
        team=Team.objects.get(slug=body["team"]), submitter=token.user, name=body["name"], kind=body["kind"],
        spec=spec, accelerator=Accelerator.objects.get(name=res["accelerator"]), gpus_per_node=res["gpus_per_node"],
        nodes=res["nodes"], max_runtime_seconds=spec["max_runtime_seconds"],
    )
    return JsonResponse({"id": job.pk, "state": job.state}, status=201)


urlpatterns = [
    path("bench/bare-jobs/", bare_create),
    path("", include("controlplane.urls")),
]
