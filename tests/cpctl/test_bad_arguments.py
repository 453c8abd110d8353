"""``cpctl`` answers bad arguments (timeouts, URLs, tokens, files, dates, ids) with a clean non-zero exit and no
traceback, before or instead of any request."""

from __future__ import annotations

import pytest

from .conftest import invoke


@pytest.mark.parametrize("argv", [
    ["--url", "http://127.0.0.1:1", "--timeout", "inf", "jobs"],
    ["--url", "http://127.0.0.1:1", "--timeout", "1e400", "jobs"],
    ["--url", "http://127.0.0.1:1", "--token", "ключ", "jobs"],
    ["--url", "http://[::1", "jobs"],
    ["--url", "http://127.0.0.1:1", "--timeout", "nan", "jobs"],
    ["--url", "http://127.0.0.1:1", "submit", "/nonexistent/file.yaml"],
    ["--url", "http://127.0.0.1:1", "submit", "/"],
    ["--url", "http://127.0.0.1:1", "costs", "--start", "not-a-date"],
    ["--url", "http://127.0.0.1:1", "logs", "1", "--node", "-1"],
    ["--url", "http://127.0.0.1:1", "job", "-1"],
    ["--url", "ftp://x", "jobs"],
    ["--url", "", "jobs"],
    ["--url", "http://127.0.0.1:99999", "jobs"],
], ids=["timeout-inf", "timeout-1e400", "non-latin1-token", "unclosed-ipv6-url", "timeout-nan", "missing-file",
        "directory", "bad-start", "negative-node", "negative-id", "ftp-url", "empty-url", "port-99999"])
def test_bad_arguments_get_a_clean_nonzero_exit_and_no_traceback(argv):
    result = invoke(argv)  # raises what the command let through
    assert result.code != 0
    assert "Traceback" not in result.err
