"""The OpenAPI 3 schema (JSON and YAML, generated without warnings) and the Swagger UI served without a CDN."""

from __future__ import annotations

import json

import yaml
from django.test import Client

JOB_PATHS = ["/api/v1/jobs/", "/api/v1/jobs/{id}/", "/api/v1/jobs/{id}/cancel/", "/api/v1/jobs/{id}/events/",
             "/api/v1/jobs/{id}/logs/", "/api/v1/jobs/{id}/attempts/"]


def test_the_schema_is_openapi_3_json_with_the_job_paths(db):
    r = Client().get("/api/schema/", {"format": "json"})
    assert r.status_code == 200
    schema = json.loads(r.content)
    assert schema["openapi"].startswith("3.")
    for path in JOB_PATHS + ["/api/v1/costs/", "/api/v1/quotas/", "/api/v1/budgets/", "/api/v1/clusters/"]:
        assert path in schema["paths"], path
    create = schema["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/yaml"} <= set(create)
    assert "tokenAuth" in schema["components"]["securitySchemes"]


def test_the_schema_is_served_as_yaml_too(db):
    r = Client().get("/api/schema/")
    assert r.status_code == 200
    schema = yaml.safe_load(r.content)
    assert schema["openapi"].startswith("3.") and "/api/v1/jobs/{id}/cancel/" in schema["paths"]


def test_the_schema_generates_without_warnings(db):
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema

    GENERATOR_STATS.reset()  # warnings already shown once in this process would not be counted again
    schema = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)
    assert not GENERATOR_STATS._warn_cache and not GENERATOR_STATS._error_cache, (
        dict(GENERATOR_STATS._warn_cache), dict(GENERATOR_STATS._error_cache))


def test_the_docs_page_uses_local_swagger_assets(db):
    r = Client().get("/api/docs/")
    assert r.status_code == 200
    page = r.content.decode()
    assert "drf_spectacular_sidecar/swagger-ui-dist/" in page
    assert "cdn.jsdelivr.net" not in page and "unpkg.com" not in page


def test_every_operation_has_a_summary_of_its_own_and_a_description(db):
    schema = json.loads(Client().get("/api/schema/", {"format": "json"}).content)
    operations = [(method.upper(), path, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    assert len(operations) > 40
    for method, path, op in operations:
        assert op.get("summary") and len(op["summary"]) <= 80, (method, path, op.get("summary"))
        assert op.get("description", "").strip(), (method, path)
    summaries = [op["summary"] for _, _, op in operations]
    repeated = {s for s in summaries if summaries.count(s) > 1}
    assert not repeated, repeated  # Swagger UI lists them side by side: each must say which operation it is
    jobs = schema["paths"]["/api/v1/jobs/"]
    assert (jobs["get"]["summary"], jobs["post"]["summary"]) == ("List jobs", "Submit a job")
    assert schema["paths"]["/api/v1/quotas/{id}/"]["patch"]["description"].startswith("Changes the fields given")


def models_in(annotation) -> list:
    """The pydantic models named by ``annotation``: itself, or those inside a union, ``Annotated`` or ``dict``."""
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def test_the_submission_components_list_exactly_the_models_fields(db):
    """The request body of ``POST /api/v1/jobs/`` is ``JobSubmission``, and it and every model below it list the
    fields of the pydantic models in ``jobs.spec``: their names, in order, and which are required."""

    from jobs.spec import JobSubmission

    schema = json.loads(Client().get("/api/schema/", {"format": "json"}).content)
    components = schema["components"]["schemas"]
    create = schema["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]
    (body,) = {create[content_type]["schema"]["$ref"] for content_type in ("application/json", "application/yaml")}
    models, seen = [JobSubmission], set()
    while models:
        model = models.pop()
        seen.add(model)
        # The request body's component takes drf-spectacular's request suffix; the models below it their own names.
        component = components[body.rsplit("/", 1)[1] if model is JobSubmission else model.__name__]
        assert list(component["properties"]) == list(model.model_fields), model.__name__
        assert sorted(component.get("required", [])) == sorted(
            name for name, field in model.model_fields.items() if field.is_required()), model.__name__
        assert component["additionalProperties"] is False
        models += [found for field in model.model_fields.values() for found in models_in(field.annotation)
                   if found not in seen and found not in models]
    # the submission, its two specs (one role, several: MultiRoleSpec) and the role, the resources, placement,
    # model, parallelism, a serving job's autoscaling (JobAutoscaling) and what it follows (JobFollow), and an after
    # entry (JobAfter)
    assert len(seen) == 11
