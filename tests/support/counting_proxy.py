"""An HTTP proxy in front of a Prometheus that records every query it forwards: what the server was asked, seen
on the wire, so that a test counts queries without looking inside the client."""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CountingProxy:
    """Forwards ``GET`` and ``POST`` requests to ``upstream`` (a Prometheus URL) and records each as
    ``(path, {parameter: value})``, form bodies included. ``url`` is where to send them; ``close()`` stops it."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.requests: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self, body: bytes | None):
                path, _, query = self.path.partition("?")
                params = dict(urllib.parse.parse_qsl(query))
                if body and "form-urlencoded" in (self.headers.get("Content-Type") or ""):
                    params.update(urllib.parse.parse_qsl(body.decode()))
                with proxy._lock:
                    proxy.requests.append((path, params))
                request = urllib.request.Request(proxy.upstream + self.path, data=body, method=self.command,
                                                 headers={k: v for k, v in self.headers.items()
                                                          if k.lower() in ("content-type", "accept")})
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, payload, kind = answer.status, answer.read(), answer.headers.get("Content-Type")
                except urllib.error.HTTPError as error:
                    status, payload, kind = error.code, error.read(), error.headers.get("Content-Type")
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):  # noqa: N802 (http.server's name)
                self._forward(None)

            def do_POST(self):  # noqa: N802
                self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def queries(self) -> list[str]:
        """The PromQL of every instant query (``/api/v1/query``) forwarded so far, in order."""
        with self._lock:
            return [params.get("query", "") for path, params in self.requests if path == "/api/v1/query"]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
