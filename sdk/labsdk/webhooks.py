"""Verify webhooks from Lab on your own server (Standard Webhooks, https://www.standardwebhooks.com/).

    from labsdk.webhooks import verify, WebhookVerificationError

    event = verify(request.body, request.headers, secret="whsec_...")
    if event["type"] == "checkpoint.ready":
        ...

Lab signs ``"<webhook-id>.<webhook-timestamp>.<body>"`` with HMAC-SHA256 under the endpoint's
``whsec_...`` secret and sends ``webhook-id`` (the same on every retry: use it to drop
duplicates), ``webhook-timestamp`` and ``webhook-signature``. This wraps the ``standardwebhooks``
package, which also refuses timestamps more than 5 minutes from your clock (replays).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks import WebhookVerificationError as _LibraryError

from labsdk.errors import LabError

__all__ = ["WebhookVerificationError", "verify"]


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
