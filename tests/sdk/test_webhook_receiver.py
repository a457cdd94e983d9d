"""labsdk.webhooks.WebhookReceiver on real HTTP requests: signatures verified per path, forged
and unexpected ones recorded as such, retries folded by webhook-id, scripted answers."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import UTC, datetime

import httpx
from labsdk.webhooks import WebhookReceiver
from standardwebhooks import Webhook

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER_SECRET = "whsec_" + "A" * 44
BODY = {"id": "evt_1", "type": "checkpoint.ready", "created_at": "2026-11-30T02:00:00Z", "data": {"step": 20}}


def signed(body: dict, *, webhook_id: str, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    payload = json.dumps(body)
    now = datetime.now(UTC)
    signature = Webhook(secret).sign(webhook_id, now, payload)
    headers = {"webhook-id": webhook_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    return payload.encode(), headers


def test_it_verifies_signed_webhooks_and_flags_forged_ones():
    with WebhookReceiver() as receiver:
        receiver.expect("/webhooks", SECRET)
        genuine, genuine_headers = signed(BODY, webhook_id="msg_1")
        forged, forged_headers = signed({**BODY, "id": "evt_2"}, webhook_id="msg_2", secret=OTHER_SECRET)
        answers = [
            httpx.post(receiver.url(), content=genuine, headers=genuine_headers),
            httpx.post(receiver.url(), content=genuine, headers=genuine_headers),  # a retry: same webhook-id
            httpx.post(receiver.url(), content=forged, headers=forged_headers),
        ]

    assert [(answer.status_code, answer.text) for answer in answers] == [(200, '{"ok": true}')] * 3
    assert [(w.webhook_id, w.verified) for w in receiver.at("/webhooks")] == [
        ("msg_1", True), ("msg_1", True), ("msg_2", False),
    ]
    unique = receiver.unique()
    assert [(w.webhook_id, w.verified, w.type) for w in unique] == [
        ("msg_1", True, "checkpoint.ready"), ("msg_2", False, None),
    ]
    assert unique[0].event == BODY
    assert unique[0].body == genuine
    assert unique[0].headers["webhook-signature"] == genuine_headers["webhook-signature"]
    assert (unique[1].event, unique[1].error) == (None, "No matching signature found")


def test_a_path_without_a_secret_records_the_webhook_unverified():
    with WebhookReceiver() as receiver:
        payload, headers = signed(BODY, webhook_id="msg_1")
        answer = httpx.post(receiver.url("/elsewhere"), content=payload, headers=headers)

    assert answer.status_code == 200
    [webhook] = receiver.at("/elsewhere")
    assert (webhook.verified, webhook.error, webhook.body) == (False, "no secret is expected for this path", payload)
    assert receiver.at("/webhooks") == []


def test_a_verified_retry_wins_over_an_earlier_copy_that_failed():
    with WebhookReceiver() as receiver:
        payload, headers = signed(BODY, webhook_id="msg_1")
        httpx.post(receiver.url(), content=payload, headers=headers)  # before the secret is known
        receiver.expect("/webhooks", SECRET)
        httpx.post(receiver.url(), content=payload, headers=headers)

    [webhook] = receiver.unique("/webhooks")
    assert webhook.verified and webhook.event == BODY


def test_it_answers_with_its_script_then_200():
    with WebhookReceiver() as receiver:
        receiver.expect("/hook", SECRET, answers=[(500, 0.0), (429, 0.0)])
        payload, headers = signed(BODY, webhook_id="msg_1")
        statuses = [httpx.post(receiver.url("/hook"), content=payload, headers=headers).status_code for _ in range(3)]

    assert statuses == [500, 429, 200]
    assert [w.verified for w in receiver.at("/hook")] == [True, True, True]
    assert len(receiver.unique("/hook")) == 1


def test_it_refuses_a_body_over_a_megabyte_and_records_nothing():
    with WebhookReceiver() as receiver:
        receiver.expect("/webhooks", SECRET)
        answer = httpx.post(receiver.url(), content=b"x" * (1024 * 1024 + 1))

    assert answer.status_code == 413
    assert receiver.received == []


def test_wait_for_returns_as_soon_as_the_webhook_arrives():
    with WebhookReceiver() as receiver:
        receiver.expect("/webhooks", SECRET)
        payload, headers = signed(BODY, webhook_id="msg_1")
        sender = threading.Timer(0.2, lambda: httpx.post(receiver.url(), content=payload, headers=headers))
        sender.start()
        started = time.monotonic()
        arrived = receiver.wait_for(lambda r: any(w.type == "checkpoint.ready" for w in r.unique()), timeout=30)
        waited = time.monotonic() - started
        sender.join()
        missing = receiver.wait_for(lambda r: len(r.received) > 1, timeout=0.2)

    assert arrived is True and waited < 10
    assert missing is False
