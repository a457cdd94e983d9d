"""A small real HTTP server that answers OpenAI's chat completions, for the tests of what Lab sends
to an OpenAI-compatible endpoint (the edge of the world: someone else's model server).

``POST <base>/chat/completions`` answers ``{"choices": [{"message": {"role": "assistant",
"content": answer(body)}, "finish_reason": "stop"}], "usage": {"prompt_tokens",
"completion_tokens"}}`` where the prompt's tokens are the words of its messages and the
completion's the characters of its text; a request without ``Authorization: Bearer <key>`` is a
401. Every request is kept (``requests``: its headers and body), in arrival order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import http_server


def usage_of(body: dict, text: str) -> dict[str, int]:
    """The usage the server reports for a request ``body`` answered with ``text``."""
    words = sum(len(str(message.get("content", "")).split()) for message in body.get("messages", []))
    return {"prompt_tokens": words, "completion_tokens": len(text), "total_tokens": words + len(text)}


@dataclass
class OpenAIServer:
    """The running server: ``base_url`` (``http://127.0.0.1:<port>/v1``), the key it wants, and
    the requests it received."""

    base_url: str
    key: str
    requests: list[dict] = field(default_factory=list)


@contextmanager
def openai_server(answer: Callable[[dict], str], *, key: str = "sk-test-endpoint", host: str = "127.0.0.1") -> Iterator[OpenAIServer]:
    """Run the server on a free port of ``host`` for the block; ``answer(body)`` is each completion's text."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            received.append({"path": self.path, "headers": dict(self.headers), "body": body})
            if self.headers.get("Authorization") != f"Bearer {key}":
                self._send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
                return
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            text = answer(body)
            self._send(200, {
                "id": f"chatcmpl-{len(received)}", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": usage_of(body, text),
            })

    server = ThreadingHTTPServer((host, 0), Handler)
    with http_server.serving(server):
        yield OpenAIServer(base_url=f"http://{host}:{server.server_address[1]}/v1", key=key, requests=received)
