"""REST API plumbing shared by every app: the scoped base viewsets, the YAML parser and the router.

Tenant scoping follows PostHog's ``routing.py``: the base viewset owns
``get_queryset`` and narrows every queryset through a ``scope_queryset`` hook
that each viewset must define, so a view cannot forget it.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Decimal

import yaml
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import permissions, serializers, viewsets
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser
from rest_framework.routers import DefaultRouter

from .parsers import JSONParser, refuse_unencodable_text  # noqa: F401 (JSONParser re-exported)


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
    """

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


class ScopedGenericViewSet(ScopedViewSetMixin, viewsets.GenericViewSet):
    """A GenericViewSet with team scoping; add the mixins (list, retrieve...) a resource needs."""


class ScopedReadOnlyViewSet(ScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """List and retrieve, scoped."""


class IsStaffOrReadOnly(permissions.BasePermission):
    """Reads for every authenticated user; writes for platform staff only."""

    def has_permission(self, request, view) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return bool(request.user and request.user.is_authenticated)
        return bool(request.user and request.user.is_staff)


# PositiveIntegerField columns are 32-bit on PostgreSQL.
INT32_MAX = 2**31 - 1


# Strict scalar fields: JSON and YAML types must already be right ("3" is not 3, true is not 1).

class StrictIntegerField(serializers.IntegerField):
    """An integer that must arrive as a JSON/YAML integer: no strings, floats or booleans."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """``true`` or ``false`` only: no ``"true"``, ``1`` or ``"yes"``."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictCharField(serializers.CharField):
    """A string that must arrive as a string (DRF's CharField would turn ``5`` into ``"5"``)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its UTC offset (``Z`` or ``+02:00``); naive input is refused."""

    default_error_messages = {"naive": "Datetime has no timezone; add Z or an offset such as +00:00."}

    def to_internal_value(self, value):
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:  # well formed but impossible: 2026-02-30, an offset of +25:00
                self.fail("invalid", format="YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z]")
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
        elif isinstance(value, dt.datetime) and value.tzinfo is None:
            self.fail("naive")
        return super().to_internal_value(value)


CENT = Decimal("0.01")


def usd_cents(amount: Decimal | None) -> str | None:
    """A USD amount as a string rounded to cents, half to even (the presentation rule of DESIGN.md's Units)."""
    if amount is None:
        return None
    return str(Decimal(amount).quantize(CENT, ROUND_HALF_EVEN))


class SharedFieldsMixin:
    """Build a serializer class's fields once per process and share them between its instances.

    DRF builds every field again for each serializer instance (a deep copy of
    the declared fields, plus model introspection for a ModelSerializer):
    about a millisecond per job shown or submitted, most of a fast request.
    The fields themselves hold no per-request state, so they are built once,
    bound to a context-free prototype instance of the class, and reused.

    Only for serializers whose fields never read ``self.context`` or
    ``self.root`` (for them the context is the prototype's: empty), and
    whose field-level code does not mutate the field. The serializer's own
    methods (``validate_<field>``, ``validate``) still run on the real
    instance, with its context.
    """

    @property
    def fields(self):
        cls = type(self)
        shared = cls.__dict__.get("_shared_fields")
        if shared is None:
            prototype = cls()
            shared = serializers.Serializer.fields.func(prototype)  # DRF's own build, bound to the prototype
            cls._shared_fields = shared
        return shared


@extend_schema_field({"type": "string", "format": "decimal", "example": "12.35"})
class UsdCentsField(serializers.Field):
    """Read-only money: a Decimal USD amount shown as a string rounded to cents (``"12.35"``)."""

    def __init__(self, **kwargs):
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value):
        return usd_cents(value)


class _NoAliasSafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader without anchors and aliases, so a small document cannot expand exponentially."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases are not accepted", event.start_mark)
        return super().compose_node(parent, index)


class YAMLParser(BaseParser):
    """Parses ``Content-Type: application/yaml`` bodies with a safe loader (no Python objects, no aliases).

    A body over ``4 x JOB_SPEC_MAX_BYTES`` (comments included) is refused;
    syntax errors answer 400 with the line and column.
    """

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        limit = 4 * settings.JOB_SPEC_MAX_BYTES
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise ParseError(f"YAML body over {limit} bytes")
        try:
            data = yaml.load(raw.decode("utf-8"), Loader=_NoAliasSafeLoader)  # a SafeLoader subclass
        except RecursionError as exc:
            raise ParseError("YAML parse error: nesting too deep") from exc
        except UnicodeDecodeError as exc:
            raise ParseError(f"YAML body is not UTF-8: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ParseError(f"YAML parse error: {exc}") from exc
        except (ValueError, OverflowError) as exc:  # a scalar PyYAML cannot build: 2024-13-45, a 5,000-digit int
            raise ParseError(f"YAML parse error: {exc}") from exc
        return refuse_unencodable_text(data)


class TextYAMLParser(YAMLParser):
    """``YAMLParser`` for ``Content-Type: text/yaml``, the older name many tools (curl scripts, editors) still send."""

    media_type = "text/yaml"


def api_router() -> DefaultRouter:
    """The ``/api/v1/`` router with every resource registered (DESIGN.md's paths).

    Built in a function because the app viewsets import this module's base
    classes; importing them at module level here would be circular.
    """
    from costs.api.utilization import BudgetStatusViewSet, UtilizationViewSet
    from costs.api.views import CostViewSet, PriceViewSet
    from frontend.api import ReportViewSet
    from jobs.api.views import JobViewSet
    from quotas.api.views import BudgetViewSet, QuotaViewSet, TeamViewSet, register_fairshare_routes
    from runners.api.views import AcceleratorViewSet, ClusterViewSet, NodePoolViewSet

    router = DefaultRouter()
    # Jobs first: URL resolution tries the routes in order, and job submission is the hottest endpoint.
    router.register("jobs", JobViewSet)
    router.register("teams", TeamViewSet)
    router.register("accelerators", AcceleratorViewSet)
    router.register("clusters", ClusterViewSet)
    router.register("node-pools", NodePoolViewSet)
    router.register("prices", PriceViewSet)
    router.register("quotas", QuotaViewSet)
    router.register("budgets", BudgetViewSet)
    router.register("costs", CostViewSet, basename="cost")
    router.register("utilization", UtilizationViewSet, basename="utilization")
    router.register("budget-status", BudgetStatusViewSet, basename="budget-status")
    router.register("reports", ReportViewSet)
    register_fairshare_routes(router)  # cohorts/, priority-classes/
    return router

