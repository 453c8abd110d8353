"""Request parsers that answer 400 instead of 500 for hostile bodies.

JSON and YAML (``application/yaml`` and ``text/yaml``), each refusing bodies over
``core.limits.yaml_max_bytes()``, lone surrogates and nesting too deep to decode; YAML through libyaml's safe loader,
refusing aliases and node floods before the document is built.
"""

from __future__ import annotations

import io

import yaml
from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser
from rest_framework.parsers import JSONParser as DRFJSONParser

from core.limits import yaml_max_bytes, yaml_too_large


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
                raise ParseError(f"invalid Unicode in the body: {exc.reason} at position {exc.start} of a string") \
                    from exc
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
    return data


class JSONParser(DRFJSONParser):
    """DRF's JSON parser that answers 400 (not 500) for nesting too deep to decode and for lone surrogates, and
    refuses a body over ``core.limits.yaml_max_bytes()`` without reading past it (what is left is dropped by
    ``core.bodies.RequestBodyMiddleware``)."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(yaml_max_bytes() + 1) if stream is not None else b""
        if too_large := yaml_too_large(raw, "JSON"):
            raise ParseError(too_large)
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON parse error - nesting too deep") from exc
        return refuse_unencodable_text(data)


def yaml_max_nodes() -> int:
    """Most YAML nodes (scalars, sequences, mappings) a submission may hold: ``settings.JOB_SPEC_MAX_BYTES // 2``.

    Every node costs at least 2 bytes in the spec's JSON encoding (``1,`` in a list, ``"":`` as a key), which is
    limited to ``JOB_SPEC_MAX_BYTES``: a document with more nodes could never be accepted, so it is refused
    before it is built.
    """
    return settings.JOB_SPEC_MAX_BYTES // 2


#: libyaml's safe loader (PyYAML's wheels carry libyaml); the pure-Python one, slower, where PyYAML was built without.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NODE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)


def _refuse_aliases_and_node_floods(text: str) -> None:
    """Walk the YAML event stream of ``text`` (libyaml's parser) and raise ParseError at the first alias, a key
    named twice in one mapping (YAML 1.2 requires keys to be unique; PyYAML would keep the last silently) or past
    ``yaml_max_nodes()`` nodes, before any Python object of the document is built.

    Aliases are refused so that a small document cannot expand exponentially (or build a cycle). The walk stops
    at the limit, so a flood of nodes costs only the limit's events (about 25 ms for 32,768 on one core).
    Raises yaml.YAMLError for a syntax error (with its line and column).
    """
    limit, nodes = yaml_max_nodes(), 0
    loader = SAFE_LOADER(text)
    # one entry per open collection: a mapping's [keys seen, whether its next node is a key], None for a sequence
    open_collections: list[list | None] = []
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.AliasEvent):
                raise ParseError(f"YAML parse error: aliases are not accepted ({event.start_mark})")
            if isinstance(event, _NODE_EVENTS):
                nodes += 1
                if nodes > limit:
                    raise ParseError(f"YAML body has more than {limit} nodes (values, lists and mappings): "
                                     "no job spec is that large")
                mapping = open_collections[-1] if open_collections else None
                if mapping is not None:
                    if mapping[1] and isinstance(event, yaml.ScalarEvent):
                        if event.value in mapping[0]:
                            mark = event.start_mark
                            raise ParseError(f'YAML parse error: duplicate key "{event.value}" at line {mark.line + 1}, '
                                             f"column {mark.column + 1}: a mapping names each key once")
                        mapping[0].add(event.value)
                    mapping[1] = not mapping[1]
                if isinstance(event, yaml.MappingStartEvent):
                    open_collections.append([set(), True])
                elif isinstance(event, yaml.SequenceStartEvent):
                    open_collections.append(None)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                open_collections.pop()
    finally:
        loader.dispose()


def load_yaml(raw: str | bytes):
    """The document of a YAML submission (API body or the UI's YAML box): size-capped
    (``core.limits.yaml_max_bytes()``), at most ``yaml_max_nodes()`` nodes, no aliases, built by PyYAML's safe
    loader on libyaml (``CSafeLoader``), valid Unicode only.

    The bounds are checked on libyaml's event stream before the document is built, so the worst accepted body
    costs about a tenth of a second of one core and the worst refused one less. Raises ParseError with the
    reason (too large, too many nodes, an alias, not UTF-8, syntax error with line and column, nesting too deep,
    a scalar PyYAML cannot build such as ``2024-13-45``).
    """
    if too_large := yaml_too_large(raw):
        raise ParseError(too_large)
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        _refuse_aliases_and_node_floods(text)
        data = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 (a safe loader)
    except RecursionError as exc:
        raise ParseError("YAML parse error: nesting too deep") from exc
    except UnicodeDecodeError as exc:
        raise ParseError(f"YAML body is not UTF-8: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ParseError(f"YAML parse error: {exc}") from exc
    except (ValueError, OverflowError) as exc:  # a scalar PyYAML cannot build: 2024-13-45, a 5,000-digit int
        raise ParseError(f"YAML parse error: {exc}") from exc
    return refuse_unencodable_text(data)


class YAMLParser(BaseParser):
    """Parses ``Content-Type: application/yaml`` bodies with ``load_yaml`` (safe loader, no aliases, size and
    node caps).

    A body over ``core.limits.yaml_max_bytes()`` (comments included) is refused
    without being read further; syntax errors answer 400 with the line and column.
    """

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return load_yaml(stream.read(yaml_max_bytes() + 1) if stream is not None else b"")


class TextYAMLParser(YAMLParser):
    """``YAMLParser`` for ``Content-Type: text/yaml``, the older name many tools (curl scripts, editors) still send."""

    media_type = "text/yaml"
