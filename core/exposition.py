"""Reading a Prometheus text exposition: the unlabelled values of named families (no Django here)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def unlabelled_values(text: str, families: dict[str, str]) -> dict[str, float] | None:
    """``{field: value}`` of the unlabelled sample of each family of ``families`` (``{family name: field}``) in
    ``text`` (Prometheus text format 0.0.4; a counter's sample is its family's name with ``_total``); None when the
    text does not parse or one of the families has no unlabelled sample."""
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:  # by sample name: a counter's is its family's with ``_total``
                field = families.get(sample.name.removesuffix("_total"))
                if field is not None and not sample.labels:
                    found[field] = float(sample.value)
    except ValueError:
        return None
    return found if set(found) == set(families.values()) else None
