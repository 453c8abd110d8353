"""The HTTP client of ``/api/v1/`` (requests, token authentication): every error answer becomes a CliError whose
exit code says what went wrong (see ``cpctl.errors``)."""

from __future__ import annotations

import json
from urllib.parse import quote, urlsplit, urlunsplit

import requests

from cpctl.errors import EXIT_BAD_INPUT, EXIT_BY_STATUS, EXIT_UNEXPECTED, EXIT_UNREACHABLE, CliError

DEFAULT_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1/"
USER_AGENT = "cpctl/1"
MAX_PAGE = 1000  # the API's max_limit
#: The header a write's reason goes in: UTF-8, percent-encoded (as Discord's ``X-Audit-Log-Reason``), since an
#: HTTP header carries Latin-1 only.
REASON_HEADER = "X-Audit-Reason"


def flatten_errors(detail, prefix: str = "") -> list[tuple[str, str]]:
    """A 400 body as ``[(field path, reason)]``: nested objects and lists become dotted paths (``spec.command.1``).

    The job API already answers with flat dotted paths; other endpoints answer
    DRF's nested shape, flattened here the same way.
    """
    if isinstance(detail, dict):
        pairs = []
        for key, value in detail.items():
            path = f"{prefix}.{key}" if prefix and key != "non_field_errors" else (prefix or str(key))
            pairs.extend(flatten_errors(value, path))
        return pairs
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return [(prefix, str(item)) for item in detail]
        pairs = []
        for index, item in enumerate(detail):
            if item:
                pairs.extend(flatten_errors(item, f"{prefix}.{index}" if prefix else str(index)))
        return pairs
    return [(prefix, str(detail))]


def api_error(response: requests.Response) -> CliError:
    """The CliError for an HTTP error answer: the API's detail (or every field error of a 400) and the exit code."""
    status = response.status_code
    code = EXIT_BY_STATUS.get(status, EXIT_UNEXPECTED)
    try:
        body = response.json()
    except ValueError:
        body = None
    if body is None:
        hint = " (is --url the control plane?)" if status == 404 else ""
        return CliError(code, f"error: HTTP {status} {response.reason or ''} from {redact(response.url)}{hint}".rstrip())
    if isinstance(body, dict) and set(body) == {"detail"}:
        lines = [f"error: {body['detail']} (HTTP {status})"]
    elif status == 400:
        lines = ["error: the API refused the request (HTTP 400):"]
        lines += [f"{path or 'request'}: {reason}" for path, reason in flatten_errors(body)]
    else:
        lines = [f"error: HTTP {status}: {json.dumps(body)}"]
    if status == 401:
        lines.append("hint: set CONTROLPLANE_TOKEN (or --token) to a valid API token")
    return CliError(code, *lines)


def redact(url: str) -> str:
    """``url`` without any ``user:password@`` part and without its query string."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def check_connection_settings(url: str, token: str | None) -> None:
    """Raise CliError (exit 2, one line) when ``url`` or ``token`` cannot be used; the token is never echoed."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:  # not echoed: a URL that does not parse cannot be cleaned of a password either
        raise CliError(EXIT_BAD_INPUT, f"error: bad control plane URL (CONTROLPLANE_URL or --url): {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(EXIT_BAD_INPUT, f"error: bad control plane URL {redact(url)}: expected http(s)://host[:port]")
    if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
        raise CliError(EXIT_BAD_INPUT, "error: the API token must be printable ASCII without spaces (as issued); "
                                       "check CONTROLPLANE_TOKEN")


class Client:
    """A small HTTP client of ``/api/v1/`` with token authentication; errors become CliError.

    Args:
        url: the control plane's base URL (``/api/v1`` at its end is dropped; no scheme means ``http://``).
        token: the API token, sent as ``Authorization: Token KEY``, or None for none.
        timeout: seconds to wait to connect and for each answer.
    """

    def __init__(self, url: str, token: str | None, timeout: float = 30.0):
        base = url.strip().rstrip("/").removesuffix("/api/v1")
        if "://" not in base:
            base = "http://" + base
        self.base_url = base
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({"Accept": "application/json", "User-Agent": USER_AGENT})
        if token:
            self.session.headers["Authorization"] = f"Token {token}"

    def close(self) -> None:
        """Close the connection pool."""
        self.session.close()

    def request(self, method: str, path: str, *, params=None, data=None, content_type: str | None = None,
                stream: bool = False, read_timeout: float | None | bool = False,
                headers: dict | None = None) -> requests.Response:
        """Send ``method`` to ``/api/v1/<path>``; returns the 2xx response, raises CliError otherwise.

        ``read_timeout``: seconds to wait for each answer (None: forever), False for the client's timeout;
        ``headers``: more request headers (``X-Audit-Reason``).
        """
        headers = {**(headers or {}), **({"Content-Type": content_type} if content_type else {})}
        timeout = (self.timeout, self.timeout if read_timeout is False else read_timeout)
        try:
            response = self.session.request(method, self.base_url + API_PREFIX + path, params=params, data=data,
                                            headers=headers, stream=stream, timeout=timeout)
        except requests.exceptions.Timeout:
            raise CliError(EXIT_UNREACHABLE, f"error: the control plane at {redact(self.base_url)} did not answer "
                                             f"within {self.timeout:g} s") from None
        except requests.exceptions.ConnectionError:
            raise CliError(EXIT_UNREACHABLE, f"error: cannot reach the control plane at {redact(self.base_url)}: "
                                             "is it running? Set --url or CONTROLPLANE_URL") from None
        except requests.exceptions.RequestException as exc:
            raise CliError(EXIT_UNREACHABLE, f"error: bad control plane URL {redact(self.base_url)}: "
                                             f"{type(exc).__name__}") from None
        if response.status_code >= 400:
            raise api_error(response)
        return response

    def json(self, method: str, path: str, **kwargs):
        """``request`` and decode the JSON body (CliError with EXIT_UNEXPECTED when it is not JSON)."""
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise CliError(EXIT_UNEXPECTED, f"error: the answer from {redact(response.url)} is not JSON "
                                            "(is --url the control plane?)") from None

    def get(self, path: str, params=None):
        """GET ``path`` and return its JSON."""
        return self.json("GET", path, params=params)

    def post(self, path: str, body: dict | None = None, reason: str | None = None):
        """POST ``body`` (JSON; none when None) to ``path`` and return the answer's JSON; ``reason`` goes in the
        ``X-Audit-Reason`` header, which the audit trail keeps with the change (ADR 0031)."""
        headers = {REASON_HEADER: quote(reason, safe=" ")} if reason else None
        if body is None:
            return self.json("POST", path, headers=headers)
        return self.json("POST", path, data=json.dumps(body), content_type="application/json", headers=headers)

    def delete(self, path: str) -> None:
        """DELETE ``path`` (a 204 answer has no body)."""
        self.request("DELETE", path)

    def get_pages(self, path: str, params=None, limit: int | None = None) -> dict:
        """Every item of a paginated list (at most ``limit``), as one page: ``{"count", "next", "previous", "results"}``.

        Pages by ``limit``/``offset`` itself rather than following ``next``,
        whose host is whatever the server thinks it is (a proxy may differ).
        """
        params = dict(params or {})
        results: list = []
        count, more = 0, None
        while True:
            want = MAX_PAGE if limit is None else min(MAX_PAGE, limit - len(results))
            page = self.get(path, {**params, "limit": want, "offset": len(results)})
            if not isinstance(page, dict) or "results" not in page:  # not paginated
                return page
            results.extend(page["results"])
            count, more = page.get("count", len(results)), page.get("next")
            if not more or not page["results"] or (limit is not None and len(results) >= limit):
                break
        return {"count": count, "next": more, "previous": None, "results": results}
