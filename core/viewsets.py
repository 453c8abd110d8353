"""The scoped base viewsets every app's REST API builds on.

Tenant scoping follows PostHog's ``routing.py``: the base viewset owns
``get_queryset`` and narrows every queryset through a ``scope_queryset`` hook
that each viewset must define, so a view cannot forget it.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.http import Http404
from rest_framework import viewsets
from rest_framework.exceptions import UnsupportedMediaType

from .schema import DescribedAutoSchema


class ScopedViewSetMixin:
    """Narrows the queryset to what the requesting user may see, before any view code runs.

    Subclasses set ``queryset`` and define ``scope_queryset(queryset, user)``
    returning the visible rows (usually ``Model.objects.visible_to(user)``,
    which is everything for staff). Objects outside the scope are simply not
    found: retrieve, update and custom actions answer 404, never 403, so a
    user cannot learn that another team's object exists.

    Overriding ``get_queryset`` is refused at class creation (raises
    ImproperlyConfigured); a deliberate bypass must be spelled
    ``dangerously_get_queryset``. A viewset without ``scope_queryset``
    raises ImproperlyConfigured on its first request.

    Every operation gets an OpenAPI summary and description
    (``core.schema.DescribedAutoSchema``; ``schema_summaries`` overrides).
    """

    schema = DescribedAutoSchema()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise ImproperlyConfigured(
                f"{cls.__name__} overrides get_queryset; define scope_queryset(queryset, user) instead, "
                "or dangerously_get_queryset() for a deliberate bypass of team scoping"
            )

    def dangerously_get_queryset(self):
        """Return a queryset here to bypass scoping on purpose; None (the default) keeps it."""
        return None

    def get_queryset(self):
        """``self.queryset`` narrowed by ``scope_queryset`` for the request's user (none for anonymous users)."""
        bypass = self.dangerously_get_queryset()
        if bypass is not None:
            return bypass
        scope = getattr(self, "scope_queryset", None)
        if scope is None:
            raise ImproperlyConfigured(f"{type(self).__name__} must define scope_queryset(queryset, user)")
        queryset = super().get_queryset()
        user = getattr(self.request, "user", None)
        # Schema generation (drf-spectacular) builds views with an anonymous user.
        if user is None or not user.is_authenticated:
            return queryset.none()
        return scope(queryset, user)

    def handle_exception(self, exc):
        """DRF's handling, with a 415 that names the accepted media types (``unsupported_media_type``)."""
        if isinstance(exc, UnsupportedMediaType):
            exc = unsupported_media_type(exc, self)
        return super().handle_exception(exc)

    def get_object(self):
        """The scoped object of the URL's lookup; a lookup holding NUL is no object (404), since PostgreSQL text
        cannot hold one and the query would fail instead of finding no row."""
        value = self.kwargs.get(self.lookup_url_kwarg or self.lookup_field)
        if isinstance(value, str) and "\x00" in value:
            raise Http404
        return super().get_object()


def unsupported_media_type(exc: UnsupportedMediaType, view) -> UnsupportedMediaType:
    """``exc`` with a detail that names the media types ``view`` accepts and how to send YAML with curl."""
    accepted = [parser.media_type for parser in view.get_parsers()]
    media_type = getattr(view.request, "content_type", "") or "none"
    detail = f'unsupported media type "{media_type}"; send the body with a Content-Type of {", ".join(accepted)}'
    if any("yaml" in t for t in accepted):
        detail += ' (e.g. curl -H "Content-Type: application/yaml" --data-binary @job.yaml)'
    return UnsupportedMediaType(media_type, detail=detail)


class ScopedGenericViewSet(ScopedViewSetMixin, viewsets.GenericViewSet):
    """A GenericViewSet with team scoping; add the mixins (list, retrieve...) a resource needs."""


class ScopedReadOnlyViewSet(ScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """List and retrieve, scoped."""
