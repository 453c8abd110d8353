"""Serializer fields shared by every app: strict scalars, aware datetimes, USD amounts, shared field sets."""

from __future__ import annotations

import datetime as dt
import re

from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.money import usd_cents

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


DATETIME_FORMAT_HINT = ("YYYY-MM-DDThh:mm[:ss[.uuuuuu]][+HH:MM|-HH:MM|Z], e.g. 2026-11-01T00:00:00Z, or a date "
                        "YYYY-MM-DD (its midnight UTC)")
#: A date alone, read as its midnight UTC.
_PLAIN_DATE = re.compile(r"^\d{4}-\d\d-\d\d$")
# An offset whose "+" a query string turned into a space: "2026-11-01T00:00:00 01:00".
_SPACE_OFFSET = re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)? \d\d:?\d\d$")


def plus_sign_hint(value: str) -> str:
    """A sentence to add to a datetime error when ``value`` looks like an offset whose ``+`` arrived as a space
    (in a URL's query string ``+`` means a space; RFC 3986 / HTML form encoding), else ``""``."""
    if _SPACE_OFFSET.match(value.strip(" ") if value.endswith(" ") else value):
        return ('; the offset\'s "+" arrived as a space: in a URL write it percent-encoded as %2B (e.g. '
                "2026-11-01T00:00:00%2B01:00), or use Z for UTC")
    return ""


class ListedChoiceField(serializers.ChoiceField):
    """A ChoiceField whose error for an unknown value lists the valid choices (``group_by=week``)."""

    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            valid = ", ".join(str(choice) for choice in self.choices)
            raise serializers.ValidationError(f'"{data}" is not a valid choice; one of {valid}',
                                              code="invalid_choice") from None


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its UTC offset (``Z`` or ``+02:00``); naive input is refused. A plain
    date (``2026-11-01``) is that day's midnight UTC, as ``cpctl`` and the job and audit filters read it.

    Errors give the format; an offset whose ``+`` arrived as a space (a query string's ``+``) gets the hint to
    percent-encode it as ``%2B``; an impossible date (``2026-02-30``) is a format error.
    """

    default_error_messages = {"naive": "Datetime has no timezone; add Z or an offset such as +00:00.",
                              "bad_format": "Datetime has wrong format. Use {format}{hint}."}

    def to_internal_value(self, value):
        if isinstance(value, str) and _PLAIN_DATE.match(value.strip()):
            try:
                day = dt.date.fromisoformat(value.strip())
            except ValueError:
                self.fail("bad_format", format=DATETIME_FORMAT_HINT, hint="")
            return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
        if isinstance(value, str):
            hint = plus_sign_hint(value)
            if hint:
                self.fail("bad_format", format=DATETIME_FORMAT_HINT, hint=hint)
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:  # well formed but impossible: 2026-02-30, an offset of +25:00
                self.fail("bad_format", format=DATETIME_FORMAT_HINT, hint="")
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
        elif isinstance(value, dt.datetime) and value.tzinfo is None:
            self.fail("naive")
        try:
            return super().to_internal_value(value)
        except serializers.ValidationError:
            self.fail("bad_format", format=DATETIME_FORMAT_HINT, hint="")


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
