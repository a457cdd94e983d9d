"""Prime's own clients (the ``prime`` CLI 0.18.0 and the ``prime-evals`` SDK 0.2.4) run in this
process against Lab's WSGI application, every HTTP request they make recorded.

Both clients build their ``httpx.Client`` themselves; ``prime_http`` makes every client built
while it is active send through one recording transport into Lab (``wsgi_transport``), so the
clients' own code runs unchanged and the test reads exactly what they sent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from django.db import connections
from prime_cli.main import app
from typer.testing import CliRunner

#: Where the clients are pointed: Lab's Prime-compatible API, as docs/prime-compat.md says.
BASE_URL = "http://testserver/prime"


@dataclass(frozen=True)
class Recorded:
    """One request a client made: method, path, query and JSON body (the bytes of another type,
    None without one)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any


def _body(request: httpx.Request, content: bytes) -> Any:
    """A request's JSON body, its raw bytes for any other type (an upload), None without one."""
    if not content:
        return None
    return json.loads(content) if "json" in request.headers.get("content-type", "") else content


@dataclass
class RecordingTransport(httpx.BaseTransport):
    """Sends each request to ``inner`` and keeps it in ``requests``. A request sent from another
    thread than the test's (``prime-evals`` uploads samples from a pool) closes that thread's
    database connection after it."""

    inner: httpx.BaseTransport
    requests: list[Recorded] = field(default_factory=list)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        content = request.read()
        self.requests.append(Recorded(
            request.method, request.url.path, dict(request.url.params), _body(request, content),
        ))
        try:
            return self.inner.handle_request(request)
        finally:
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()  # a client's worker thread: its connection would outlive the test

    def calls(self) -> list[tuple[str, str]]:
        """``(method, path)`` of each request so far, in order."""
        return [(item.method, item.path) for item in self.requests]


@pytest.fixture
def prime_http(monkeypatch, wsgi_transport, tmp_path) -> RecordingTransport:
    """Route every ``httpx.Client`` into Lab through a ``RecordingTransport``, with Prime's
    configuration pointing at Lab (``PRIME_API_BASE_URL``), no version check and a ``HOME`` of its
    own; returns the transport. Set ``PRIME_API_KEY`` per call."""
    recorder = RecordingTransport(wsgi_transport)
    original = httpx.Client.__init__

    def through_lab(self, *args, **kwargs):
        kwargs["transport"] = recorder
        original(self, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "__init__", through_lab)
    monkeypatch.setenv("PRIME_API_BASE_URL", BASE_URL)
    monkeypatch.setenv("PRIME_DISABLE_VERSION_CHECK", "1")
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)
    return recorder


def prime_cli(key: str, *argv: str):
    """Run ``prime --plain ARGV`` in this process with ``key``; return typer's Result (``exit_code``,
    ``output``)."""
    return CliRunner().invoke(app, ["--plain", *argv], env={"PRIME_API_KEY": key, "NO_COLOR": "1", "COLUMNS": "200"})
