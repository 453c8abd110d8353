"""Request parsers that answer 400 instead of 500 for hostile bodies.

Kept apart from ``controlplane.api`` because DRF imports
``DEFAULT_PARSER_CLASSES`` while ``rest_framework.views`` loads, and
``controlplane.api`` imports the viewsets (a circular import otherwise).
"""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser as DRFJSONParser


def refuse_unencodable_text(data):
    """Raise ParseError when a string (key or value) of parsed ``data`` is not valid Unicode (a lone surrogate).

    JSON's ``\\ud800`` escapes decode to lone surrogates, which no UTF-8 column or database driver accepts
    (they would fail at save time, a 500). Walked iteratively: the parsers already bounded the depth.
    """
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ParseError(f"invalid Unicode in the body: {exc.reason} at position {exc.start} of a string")
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
    return data


class JSONParser(DRFJSONParser):
    """DRF's JSON parser that answers 400 (not 500) for nesting too deep to decode and for lone surrogates."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nesting too deep") from exc
        return refuse_unencodable_text(data)
