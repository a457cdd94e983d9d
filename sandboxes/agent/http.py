"""The little HTTP the agent needs over ASGI: a request read with a size limit, JSON, bytes and
streamed answers, and errors in Lab's body (docs/api.md "Errors")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from lab.lib.error_types import error_type


class AgentError(Exception):
    """A refusal: HTTP ``status``, Lab's error ``code``, a message and the field (``param``)."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"type": error_type(self.status), "code": self.code, "message": self.message, "param": self.param, "errors": []}}


@dataclass
class Request:
    """One request: its method, path, lower-cased headers and query (first value of each)."""

    scope: dict
    receive: Any

    @property
    def method(self) -> str:
        return self.scope["method"]

    @property
    def path(self) -> str:
        return self.scope["path"]

    @property
    def headers(self) -> dict[str, str]:
        return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in self.scope.get("headers", ())}

    @property
    def query(self) -> dict[str, str]:
        parsed = parse_qs(self.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        return {name: values[0] for name, values in parsed.items()}

    async def body(self, *, limit: int) -> bytes:
        """Return the body; AgentError 413 ``request_too_large`` past ``limit`` bytes."""
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise AgentError(413, "request_too_large", f"The body is over {limit} bytes.")
        chunks, size = [], 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise AgentError(400, "invalid_request", "The client went away.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise AgentError(413, "request_too_large", f"The body is over {limit} bytes.")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def json(self, *, limit: int = 1024 * 1024) -> Any:
        """Return the body as JSON (``{}`` when empty); AgentError 400 when it is not JSON."""
        raw = await self.body(limit=limit)
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise AgentError(400, "invalid_request", "The body is not JSON.") from None


async def send_bytes(send, status: int, body: bytes, content_type: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer ``status`` with ``body``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def send_json(send, status: int, body: Any) -> None:
    """Answer ``status`` with ``body`` as JSON."""
    await send_bytes(send, status, json.dumps(body, separators=(",", ":")).encode(), "application/json")


async def send_stream(send, status: int, chunks: AsyncIterator[bytes], content_type: str) -> None:
    """Answer ``status`` with each chunk sent as soon as it is made."""
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type.encode())]})
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
