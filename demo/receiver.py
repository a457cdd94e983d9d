"""A webhook receiver such as a user runs: a small HTTP server that checks each webhook's
Standard Webhooks signature with ``labsdk.webhooks.verify`` and keeps what arrived."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from labsdk.webhooks import WebhookVerificationError, verify

#: Largest body read; Lab's webhooks are a few kilobytes.
MAX_BODY_BYTES = 1024 * 1024


@dataclass
class ReceivedWebhook:
    """One webhook request: its ``webhook-id`` header, the verified body (None when the
    signature check failed) and the reason it failed."""

    webhook_id: str
    body: dict[str, Any] | None
    error: str | None

    @property
    def verified(self) -> bool:
        """Whether the signature and timestamp checked out."""
        return self.body is not None

    @property
    def type(self) -> str | None:
        """The event type (``checkpoint.ready``, ``job.succeeded``, ...) of a verified webhook."""
        return self.body.get("type") if self.body else None


class WebhookReceiver:
    """Listen on ``127.0.0.1`` (a free port) for ``POST /webhooks`` and verify each with ``secret``.

    Set :attr:`secret` after registering the endpoint (Lab shows the secret once, on create); a
    webhook that arrives before is recorded as unverified. Every request is answered 204, the
    way a receiver acknowledges what it has stored.
    """

    def __init__(self) -> None:
        self.secret: str | None = None
        self.received: list[ReceivedWebhook] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = min(int(self.headers.get("content-length") or 0), MAX_BODY_BYTES)
                payload = self.rfile.read(length)
                receiver._record(payload, dict(self.headers.items()))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Keep the demo's terminal for the demo's own output."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/webhooks"
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    def _record(self, payload: bytes, headers: dict[str, str]) -> None:
        webhook_id = next((value for name, value in headers.items() if name.lower() == "webhook-id"), "")
        body, error = None, None
        if self.secret is None:
            error = "arrived before the endpoint's secret was known"
        else:
            try:
                body = verify(payload, headers, self.secret)
            except WebhookVerificationError as exc:
                error = str(exc)
        with self._arrived:
            self.received.append(ReceivedWebhook(webhook_id=webhook_id, body=body, error=error))
            self._arrived.notify_all()

    def start(self) -> WebhookReceiver:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def wait_for(self, predicate, *, timeout: float) -> bool:
        """Wait until ``predicate(received)`` is true or ``timeout`` seconds pass; return which."""
        with self._arrived:
            return self._arrived.wait_for(lambda: predicate(list(self.received)), timeout=timeout)

    def snapshot(self) -> list[ReceivedWebhook]:
        """Return the webhooks received so far, oldest first, one per ``webhook-id`` (a retried
        delivery carries the same id; a verified copy wins over one that failed the check)."""
        with self._lock:
            unique: dict[str, ReceivedWebhook] = {}
            for webhook in self.received:
                key = webhook.webhook_id or str(id(webhook))
                if key not in unique or (webhook.verified and not unique[key].verified):
                    unique[key] = webhook
            return list(unique.values())

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
