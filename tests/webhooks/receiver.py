"""A real webhook receiver for tests: an HTTP server on 127.0.0.1 that verifies every signature.

Each path is one receiving endpoint with its own secret (``Receiver.expect(path, secret)``) and
an optional script of answers (status code, delay in seconds) used one per request, then 200.
Every request is recorded with its headers, raw body and whether ``standardwebhooks`` accepted it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook


@dataclass
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    error: str
    arrived: float

    @property
    def event(self) -> dict:
        """The parsed body."""
        return json.loads(self.body)

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    """Start with ``with Receiver() as receiver:``; ``receiver.url("/a")`` is the endpoint URL."""

    def __init__(self, port: int = 0):
        self.secrets: dict[str, str] = {}
        self.scripts: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {name.lower(): value for name, value in self.headers.items()}
                receiver.record(self.path, headers, body)
                status, delay = receiver.next_answer(self.path)
                if delay:
                    time.sleep(delay)
                answer = b'{"ok": true}' if status < 300 else b"nope"
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # 25 connections open at once must not overflow the backlog

            def handle_error(self, request, client_address) -> None:
                pass  # a client closing a kept-alive connection is not a test failure

        self.server = Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str) -> str:
        """Return the URL of ``path`` on this receiver."""
        return f"http://127.0.0.1:{self.port}{path}"

    def expect(self, path: str, secret: str, answers: list[tuple[int, float]] | None = None) -> None:
        """Verify requests to ``path`` with ``secret``; answer them with ``answers`` first."""
        with self.lock:
            self.secrets[path] = secret
            self.scripts[path] = list(answers or [])

    def next_answer(self, path: str) -> tuple[int, float]:
        with self.lock:
            script = self.scripts[path]
            return script.pop(0) if script else (200, 0.0)

    def record(self, path: str, headers: dict[str, str], body: bytes) -> None:
        secret = self.secrets.get(path)
        verified, error = False, "no secret for this path"
        if secret:
            try:
                Webhook(secret).verify(body, headers)
                verified, error = True, ""
            except Exception as exc:  # noqa: BLE001 - recorded, asserted by the test
                error = f"{type(exc).__name__}: {exc}"
        with self.lock:
            self.received.append(Received(path, headers, body, verified, error, time.time()))

    def at(self, path: str) -> list[Received]:
        """Return the requests that reached ``path``, in arrival order."""
        with self.lock:
            return [item for item in self.received if item.path == path]
