"""OpenAPI schema post-processing: the error answers every operation can give, declared where drf-spectacular
leaves them out, so the schema matches every answer (``tests/controlplane/test_openapi_conformance.py``).

``declare_error_responses`` (a ``POSTPROCESSING_HOOKS`` entry) adds to each operation that lacks them:

- 400 (bad input: a field and its reason, or ``detail``), 401 (no or a bad token) and 403 (not allowed),
- 404 for an operation with a path parameter (no such object, or another team's),
- 409 for an action on an object that changes it (POST to ``.../{id}/<action>/``: a state that forbids it),
- 415 for an operation with a request body (a media type it does not parse, or a malformed multipart body),
- 503 with ``Retry-After`` (``core.middleware``: the database or a cluster unavailable).

Bodies are JSON objects: ``{"detail": "..."}`` or ``{"<field>": ["<reason>", ...]}``.
"""

from __future__ import annotations

ERROR_SCHEMA = {"type": "object", "additionalProperties": True,
                "description": '{"detail": "..."} or {"<field>": ["<reason>", ...]}'}
REASONS = {"400": "Bad input: each field with its reason", "401": "No or an unknown API token",
           "403": "Not allowed for this user", "404": "No such object (or one of another team)",
           "409": "The object's state does not allow this",
           "415": "A request body of a media type this operation does not parse", "503": "A dependency is unavailable; retry later"}


def declare_error_responses(result: dict, generator, request, public) -> dict:
    """Add the error answers above to every operation of ``result`` (the schema dict) that lacks them."""
    result.setdefault("components", {}).setdefault("schemas", {})["ErrorDetail"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/ErrorDetail"}
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            codes = ["400", "401", "403", "503"]
            if "{" in path:
                codes.append("404")
            if method != "get" and "{" in path:
                codes.append("409")
            if "requestBody" in operation:
                codes.append("415")
            responses = operation.setdefault("responses", {})
            for code in codes:
                if code not in responses:
                    responses[code] = {"description": REASONS[code], "content": {"application/json": {"schema": ref}}}
    return result
