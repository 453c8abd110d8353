"""A webhook receiver on 127.0.0.1: a real HTTP server in a thread that records every POST and answers the
statuses it is told, in order (the last one again once they run out), or holds the request unanswered."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """``url`` takes POSTs; ``received`` lists ``{"path", "headers", "body", "json"}`` of each one, in order.

    ``statuses``: the answers, one per request (the last repeats). ``hold``: never answer; each request waits
    until ``release()`` (``arrived`` is set when the first one is in).
    """

    def __init__(self, statuses=(200,), hold: bool = False):
        self.statuses, self.hold = list(statuses), hold
        self.received: list[dict] = []
        self.arrived, self.released = threading.Event(), threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.received.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                          "json": json.loads(body)})
                receiver.arrived.set()
                if receiver.hold:
                    receiver.released.wait(30)
                    return
                status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/B000/key"

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def release(self) -> None:
        self.released.set()

    def __exit__(self, *exc) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def signed_by(request: dict, secret: str) -> bool:
    """Whether ``request`` carries ``sha256=<HMAC-SHA256 of its raw body keyed with secret>``, computed here as a
    receiver would (GitHub's ``X-Hub-Signature-256`` scheme)."""
    expected = "sha256=" + hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(request["headers"].get("X-Controlplane-Signature-256", ""), expected)
