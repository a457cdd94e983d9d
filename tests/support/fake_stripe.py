"""A fake Stripe API on a real local socket (``STRIPE_API_BASE`` points the real ``stripe`` client
at it), and webhook payloads signed the way Stripe signs them.

The server answers the few endpoints Lab calls, records every request (method, path, decoded
form body, headers) and can be scripted to fail (``fail_next[path] = [status, ...]``).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

from tests.support import http_server


class FakeStripe:
    """Start with ``with FakeStripe() as stripe: ...``; ``base_url`` is its address."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.fail_next: dict[str, list[int]] = {}
        self.accepted_meter_events: list[dict] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = dict(parse_qsl(self.rfile.read(length).decode())) if length else {}
                status, body = fake.handle(method, self.path, form, dict(self.headers))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self._answer("POST")

            def do_DELETE(self) -> None:
                self._answer("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> FakeStripe:
        http_server.start(self.server)
        return self

    def __exit__(self, *exc_info) -> None:
        http_server.stop(self.server)

    def calls(self, path: str) -> list[dict]:
        """Return the recorded requests to ``path``."""
        return [request for request in self.requests if request["path"] == path]

    def handle(self, method: str, path: str, form: dict, headers: dict) -> tuple[int, dict]:
        with self._lock:
            self.requests.append({"method": method, "path": path, "form": form, "headers": headers})
            failures = self.fail_next.get(path) or []
            if failures:
                status = failures.pop(0)
                return status, {"error": {"type": "api_error", "message": f"scripted {status}"}}
            number = next(self._ids)
        if path == "/v1/customers":
            return 200, {"id": f"cus_test{number}", "object": "customer"}
        if path == "/v1/checkout/sessions":
            return 200, {"id": f"cs_test_{number}", "object": "checkout.session", "url": f"https://checkout.stripe.test/c/cs_test_{number}"}
        if path == "/v1/billing_portal/sessions":
            return 200, {"id": f"bps_{number}", "object": "billing_portal.session", "url": f"https://billing.stripe.test/p/{number}"}
        if path == "/v1/subscriptions":
            return 200, {"id": f"sub_{number}", "object": "subscription", "status": "active"}
        if path.startswith("/v1/subscriptions/") and method == "DELETE":
            return 200, {"id": path.rsplit("/", 1)[1], "object": "subscription", "status": "canceled"}
        if path == "/v1/billing/meter_events":
            with self._lock:
                self.accepted_meter_events.append(form)
            return 200, {"object": "billing.meter_event", "identifier": form.get("identifier"), "event_name": form.get("event_name")}
        return 404, {"error": {"type": "invalid_request_error", "message": f"no such path {path}"}}


def signed(event: dict, secret: str, *, timestamp: int | None = None) -> tuple[bytes, str]:
    """Return ``event`` as a payload and its ``Stripe-Signature`` header: ``t=<unix>,v1=<hex
    HMAC-SHA256 of "t.payload" with the endpoint secret>`` (https://docs.stripe.com/webhooks#verify-manually)."""
    payload = json.dumps(event).encode()
    timestamp = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return payload, f"t={timestamp},v1={digest}"
