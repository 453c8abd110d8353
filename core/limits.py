"""Input limits shared by the REST API and the web UI, so both refuse the same input with the same reason.

- ``yaml_max_bytes()``: largest YAML submission (API body or the UI's YAML
  box), comments included: 4 x ``settings.JOB_SPEC_MAX_BYTES`` (the spec's JSON
  encoding is limited to that; YAML spends more bytes on the same document);
  also the largest JSON body of the API.
- ``rate_or_none``: a rate limit read from the environment (``"N/min"``, or off).
- ``THRESHOLD_MAX_PERCENT``: budget alert thresholds lie in (0, 1000] percent
  of the budget's amount (an alert at 10x the budget is the furthest useful).
"""

from __future__ import annotations

from django.conf import settings

THRESHOLD_MAX_PERCENT = 1000


def yaml_max_bytes() -> int:
    """Bytes of the largest accepted YAML submission (UTF-8)."""
    return 4 * settings.JOB_SPEC_MAX_BYTES


def yaml_too_large(text: str | bytes, language: str = "YAML") -> str | None:
    """The reason ``text`` is refused for its size, or None when it fits ``yaml_max_bytes()``; ``language`` names
    the document in the reason (the API's JSON bodies have the same cap)."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    limit = yaml_max_bytes()
    return f"{language} body over {limit} bytes" if size > limit else None


def threshold_out_of_range(value) -> bool:
    """Whether an alert threshold (percent) lies outside (0, ``THRESHOLD_MAX_PERCENT``]."""
    return not 0 < value <= THRESHOLD_MAX_PERCENT


def rate_or_none(value: str | None) -> str | None:
    """A rate setting from the environment: ``"N/s|min|h|day"``, or None for ``""``/``off`` (no limit).

    Raises ValueError for anything else, so a typo stops the settings from loading instead of disabling a limit.
    """
    value = (value or "").strip()
    if value.lower() in ("", "off", "none"):
        return None
    number, _, period = value.partition("/")
    if not number.isdigit() or int(number) < 1 or period[:1] not in ("s", "m", "h", "d"):
        raise ValueError(f"a rate is N/s, N/min, N/h or N/day (or off), not {value!r}")
    return value

