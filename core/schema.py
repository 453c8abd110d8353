"""OpenAPI schema of the API: operation summaries and descriptions, and the error answers every
operation can give.

drf-spectacular gives an operation the docstring of its action, else of its
view class, as description, and no summary. :class:`DescribedAutoSchema`
adds a summary to every operation, and a description that says what the
operation does before what the resource is:

- a viewset's ``schema_summaries`` (action name -> summary) wins;
- else an action with a docstring of its own is summarised by its first
  sentence (cut before a parenthesis, colon or semicolon);
- else a standard action gets a standard sentence on the model's verbose
  names ("List quotas", "Show one quota", "Create a quota", ...).

``declare_error_responses`` (a ``POSTPROCESSING_HOOKS`` entry) adds to each operation that lacks them:

- 400 (bad input: a field and its reason, or ``detail``), 401 (no or a bad token) and 403 (not allowed),
- 404 for an operation with a path parameter or a ``job`` query parameter (no such object, or another team's),
- 409 for an action on an object that changes it (POST to ``.../{id}/<action>/``: a state that forbids it),
- 413 and 415 for an operation with a request body (over ``REQUEST_BODY_MAX_BYTES``, refused unread; a media
  type it does not parse, or a malformed multipart body),
- 429 with ``Retry-After`` (rate limits: failed token checks from the address, submissions; docs/adr/0033),
- 503 with ``Retry-After`` (``core.middleware``: the database or a cluster unavailable).

Bodies are JSON objects: ``{"detail": "..."}`` or ``{"<field>": ["<reason>", ...]}``.
"""

from __future__ import annotations

import inspect
import re

from drf_spectacular.openapi import AutoSchema

# Standard actions of DRF's mixins: (summary, first sentence of the description), on {one} and {many}.
STANDARD = {
    "list": ("List {many}", "Lists the {many} you may see{paged}."),
    "retrieve": ("Show one {one}", "Shows one {one} by its id; one you may not see answers 404."),
    "create": ("Create a {one}", "Creates a {one}; a bad field answers 400 with its name and the reason, and "
                                 "nothing is stored."),
    "update": ("Replace a {one}", "Replaces every writable field of a {one} (400 for a bad field; nothing changes)."),
    "partial_update": ("Change fields of a {one}", "Changes the fields given of a {one} (400 for a bad field; "
                                                   "nothing changes)."),
    "destroy": ("Delete a {one}", "Deletes a {one}."),
}
_CUT = re.compile(r"\s*(?:\(|:|;|—| - )")


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` without markup, cut before a parenthesis, colon, semicolon or dash, at most
    80 characters (a summary)."""
    text = " ".join(text.strip().split()).replace("``", "")
    sentence = re.split(r"(?<=[a-z0-9)])\. ", text, maxsplit=1)[0].rstrip(".")
    sentence = _CUT.split(sentence, maxsplit=1)[0]
    return sentence if len(sentence) <= 80 else sentence[:77].rsplit(" ", 1)[0] + "..."


class DescribedAutoSchema(AutoSchema):
    """AutoSchema with a summary for every operation and a description that starts with what it does."""

    def _names(self) -> tuple[str, str]:
        queryset = getattr(self.view, "queryset", None)
        model = getattr(queryset, "model", None)
        if model is None:
            return "object", "objects"
        return str(model._meta.verbose_name), str(model._meta.verbose_name_plural)

    def _own_docstring(self) -> str | None:
        """The docstring of the action's method when the view's own code defines it (not a DRF mixin)."""
        action = getattr(self.view, "action", None)
        method = getattr(type(self.view), action, None) if action else None
        if method is None or type(self.view).__module__.startswith("rest_framework"):
            return None
        owner = next((klass for klass in type(self.view).__mro__ if action in klass.__dict__), None)
        if owner is None or owner.__module__.startswith(("rest_framework", "drf_spectacular")):
            return None
        return inspect.getdoc(method)

    def get_summary(self):
        action = getattr(self.view, "action", None)
        overrides = getattr(self.view, "schema_summaries", {}) or {}
        if action in overrides:
            return overrides[action]
        own = self._own_docstring()
        if own:
            return first_sentence(own)
        one, many = self._names()
        if action in STANDARD:
            summary = STANDARD[action][0].format(one=one, many=many)
            return summary[0].upper() + summary[1:]
        return super().get_summary()

    def get_description(self):
        own = self._own_docstring()
        if own:
            return own
        action = getattr(self.view, "action", None)
        about = inspect.getdoc(type(self.view)) or ""
        if action in STANDARD:
            one, many = self._names()
            paged = ", a page at a time (``limit``, ``offset``)" if getattr(self.view, "pagination_class", None) else ""
            return f"{STANDARD[action][1].format(one=one, many=many, paged=paged)}\n\n{about}".strip()
        return super().get_description()


ERROR_SCHEMA = {"type": "object", "additionalProperties": True,
                "description": '{"detail": "..."} or {"<field>": ["<reason>", ...]}'}
REASONS = {"400": "Bad input: each field with its reason", "401": "No or an unknown API token",
           "403": "Not allowed for this user", "404": "No such object (or one of another team)",
           "409": "The object's state does not allow this",
           "413": "A request body over the size limit, refused unread",
           "415": "A request body of a media type this operation does not parse",
           "429": "Over a rate limit; retry after the Retry-After seconds",
           "503": "A dependency is unavailable; retry later"}


def declare_error_responses(result: dict, generator, request, public) -> dict:
    """Add the error answers above to every operation of ``result`` (the schema dict) that lacks them."""
    result.setdefault("components", {}).setdefault("schemas", {})["ErrorDetail"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/ErrorDetail"}
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            codes = ["400", "401", "403", "429", "503"]
            if "{" in path or any(p.get("in") == "query" and p.get("name") == "job"
                                  for p in operation.get("parameters", [])):
                codes.append("404")  # a path id, or ?job=ID naming a job the user may not see
            if method != "get" and "{" in path:
                codes.append("409")
            if "requestBody" in operation:
                codes.extend(["413", "415"])
            responses = operation.setdefault("responses", {})
            for code in codes:
                if code not in responses:
                    responses[code] = {"description": REASONS[code], "content": {"application/json": {"schema": ref}}}
    return result
