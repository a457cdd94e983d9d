"""Webhook endpoints from the SDK, and verifying Lab's webhooks on your own server (Standard Webhooks, https://www.standardwebhooks.com/).

    from labsdk.webhooks import verify, WebhookVerificationError

    event = verify(request.body, request.headers, secret="whsec_...")
    if event["type"] == "checkpoint.ready":
        ...

Lab signs ``"<webhook-id>.<webhook-timestamp>.<body>"`` with HMAC-SHA256 under the endpoint's
``whsec_...`` secret and sends ``webhook-id`` (the same on every retry: use it to drop
duplicates), ``webhook-timestamp`` and ``webhook-signature``. This wraps the ``standardwebhooks``
package, which also refuses timestamps more than 5 minutes from your clock (replays).

To try webhooks on your own machine, :class:`WebhookReceiver` is a small HTTP server that
receives them, verifies each with :func:`verify` and keeps what arrived::

    with WebhookReceiver() as receiver:
        endpoint = ...  # register receiver.url() with Lab (dashboard or POST /webhook-endpoints)
        receiver.expect("/webhooks", endpoint["secret"])
        receiver.wait_for(lambda r: any(w.type == "job.succeeded" for w in r.unique()), timeout=600)

Lab refuses loopback URLs unless ``LAB_WEBHOOK_ALLOW_PRIVATE`` is on (local development).

The endpoints themselves are managed with the default client's :class:`labsdk._webhooks.Webhooks`,
here as module functions (``create``, ``list``, ``retrieve``, ``update``, ``delete``, ``test``,
``rotate_secret``, ``deliveries``, ``redeliver``), so that ``import labsdk as lab`` then
``lab.webhooks.create(url)`` works as ``lab.jobs.create(...)`` does::

    endpoint = lab.webhooks.create(receiver.url(), events=["job.succeeded"])
    receiver.expect("/webhooks", endpoint.secret)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks import WebhookVerificationError as _LibraryError

from labsdk._default import default_client
from labsdk.errors import LabError

__all__ = ["ReceivedWebhook", "WebhookReceiver", "WebhookVerificationError", "verify"]

#: The default client's endpoint calls offered as this module's functions.
_ENDPOINT_CALLS = ("create", "list", "retrieve", "update", "delete", "test", "rotate_secret", "deliveries", "redeliver")


def __getattr__(name: str) -> Any:
    if name in _ENDPOINT_CALLS:
        return getattr(default_client().webhooks, name)
    raise AttributeError(f"module 'labsdk.webhooks' has no attribute {name!r}")


class WebhookVerificationError(LabError):
    """The payload is not a genuine, fresh webhook from Lab for this secret (do not process it)."""


def verify(payload: bytes | str, headers: Mapping[str, str] | Iterable[tuple[str, str]], secret: str) -> dict[str, Any]:
    """Check a webhook's signature and timestamp; return its parsed body ``{"id", "type", "created_at", "data"}``.

    ``payload`` is the raw request body exactly as received (bytes or str; never a re-serialized
    dict). ``headers`` is any mapping or list of pairs of the request's headers (names in any
    case). ``secret`` is the endpoint's ``whsec_...`` secret. Raises WebhookVerificationError when
    a header is missing, the timestamp is off by more than 5 minutes, no signature matches, the
    secret is malformed or the body is not a JSON object.
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    lowered = {str(name).lower(): str(value) for name, value in pairs}
    if isinstance(payload, bytes):
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise WebhookVerificationError("The payload is not UTF-8.") from None
    try:
        webhook = Webhook(secret)
    except Exception:
        raise WebhookVerificationError("The secret is not a whsec_... Standard Webhooks secret.") from None
    try:
        body = webhook.verify(payload, lowered)
    except _LibraryError as exc:
        raise WebhookVerificationError(str(exc)) from None
    except ValueError as exc:  # a malformed signature header or a body that is not JSON
        raise WebhookVerificationError(f"Malformed webhook: {exc}") from None
    if not isinstance(body, dict):
        raise WebhookVerificationError("The payload is not a JSON object.")
    return body


#: Largest request body the receiver reads; Lab's webhooks are a few kilobytes.
MAX_BODY_BYTES = 1024 * 1024
#: What the receiver answers by default: a 2xx within 15 s counts as delivered.
DEFAULT_ANSWER = (200, 0.0)


@dataclass(frozen=True)
class ReceivedWebhook:
    """One request that reached a :class:`WebhookReceiver`.

    ``headers`` have lower-case names; ``body`` is the raw body; ``arrived`` the receiver's
    clock (Unix seconds) when it was read. ``event`` is the body as :func:`verify` returned it,
    or None when the check failed (``error`` says why) or no secret was expected for ``path``.
    """

    path: str
    headers: dict[str, str]
    body: bytes
    arrived: float
    event: dict[str, Any] | None
    error: str

    @property
    def verified(self) -> bool:
        """Whether the signature and timestamp checked out."""
        return self.event is not None

    @property
    def webhook_id(self) -> str:
        """The ``webhook-id`` header: the same on every retry of one delivery ("" when missing)."""
        return self.headers.get("webhook-id", "")

    @property
    def type(self) -> str | None:
        """The event type (``checkpoint.ready``, ``job.succeeded``, ...) of a verified webhook."""
        return self.event.get("type") if self.event is not None else None


class WebhookReceiver:
    """An HTTP server on ``host:port`` (a free port by default) that receives webhooks.

    Each path is one receiving endpoint: :meth:`expect` gives it the endpoint's secret and,
    optionally, a script of answers ``(status code, delay in seconds)`` used one per request,
    then ``200 {"ok": true}`` (the body of a scripted answer that is not 2xx: ``{"ok": false}``). Every ``POST`` is recorded as a :class:`ReceivedWebhook`, in
    arrival order, whether or not it verified. Start it with :meth:`start` or ``with``; it
    serves from daemon threads until :meth:`stop`.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.received: list[ReceivedWebhook] = []
        self._secrets: dict[str, str] = {}
        self._answers: dict[str, list[tuple[int, float]]] = {}
        self._first: dict[tuple[str, str], ReceivedWebhook] = {}
        self._lock = threading.RLock()
        self._arrived = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Lab's client uses it

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                if length > MAX_BODY_BYTES:
                    # Read it all (and drop it), so the sender gets the answer rather than a reset.
                    while length > 0 and (chunk := self.rfile.read(min(length, 65536))):
                        length -= len(chunk)
                    self.send_error(413)
                    return
                body = self.rfile.read(length)
                headers = {name.lower(): value for name, value in self.headers.items()}
                path = self.path
                receiver._record(path, headers, body)
                status, delay = receiver._next_answer(path)
                if delay:
                    time.sleep(delay)
                answer = b'{"ok": true}' if status < 300 else b'{"ok": false}'
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the sender gave up waiting (its timeout): nothing to answer

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Keep the terminal for the program's own output."""

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512  # many deliveries connecting at once must not overflow the backlog

            def handle_error(self, request, client_address) -> None:
                """A sender closing a kept-alive connection is not an error worth a traceback."""

        self._server = Server((host, port), Handler)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    def url(self, path: str = "/webhooks") -> str:
        """Return the URL to register for ``path`` on this receiver."""
        return f"http://{self.host}:{self.port}{path}"

    def expect(self, path: str, secret: str, answers: Iterable[tuple[int, float]] | None = None) -> None:
        """Verify requests to ``path`` with the endpoint's ``whsec_...`` secret from now on;
        answer the next ones with ``answers`` (status code, seconds to wait first), then 200."""
        with self._lock:
            self._secrets[path] = secret
            self._answers[path] = list(answers or ())

    def _next_answer(self, path: str) -> tuple[int, float]:
        with self._lock:
            script = self._answers.get(path)
            return script.pop(0) if script else DEFAULT_ANSWER

    def _record(self, path: str, headers: dict[str, str], body: bytes) -> None:
        with self._lock:
            secret = self._secrets.get(path)
        event, error = None, "no secret is expected for this path"
        if secret is not None:
            try:
                event, error = verify(body, headers, secret), ""
            except WebhookVerificationError as exc:
                error = str(exc)
        webhook = ReceivedWebhook(path=path, headers=headers, body=body, arrived=time.time(), event=event, error=error)
        with self._arrived:
            self.received.append(webhook)
            key = (path, webhook.webhook_id or f"#{len(self.received)}")
            first = self._first.get(key)
            if first is None or (webhook.verified and not first.verified):
                self._first[key] = webhook
            self._arrived.notify_all()

    def at(self, path: str) -> list[ReceivedWebhook]:
        """Return every request that reached ``path``, retries included, in arrival order."""
        with self._lock:
            return [webhook for webhook in self.received if webhook.path == path]

    def unique(self, path: str | None = None) -> list[ReceivedWebhook]:
        """Return one webhook per ``(path, webhook-id)``, first arrival first: a retried delivery
        carries the same id, so this is what a receiver that drops repeats processes. A verified
        copy wins over an earlier one that failed the check."""
        with self._lock:
            return [webhook for (where, _), webhook in self._first.items() if path is None or where == path]

    def wait_for(self, predicate: Callable[[WebhookReceiver], object], *, timeout: float) -> bool:
        """Wait until ``predicate(self)`` is true, checked as each webhook arrives, or ``timeout``
        seconds pass; return which. The predicate runs with the receiver's lock held."""
        with self._arrived:
            return bool(self._arrived.wait_for(lambda: predicate(self), timeout=timeout))

    def start(self) -> WebhookReceiver:
        """Start serving in a background thread; return the receiver."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (safe to call more than once)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
