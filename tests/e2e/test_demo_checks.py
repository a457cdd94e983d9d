"""The demo's verdicts and its webhook receiver, without starting Lab: the learning check's
windows and threshold, the settings it refuses, and signatures checked on real HTTP requests."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import httpx
import pytest
from standardwebhooks import Webhook

from demo.program import DemoError, DemoSettings, check_learning
from demo.receiver import WebhookReceiver

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def test_it_passes_learning_when_the_last_five_steps_average_at_least_a_tenth_more():
    rewards = {step: 0.0 for step in range(1, 16)} | {step: 0.1 for step in range(16, 21)}

    check = check_learning(rewards, model=SMOLLM2, max_steps=20)

    assert check.passed is True
    assert check.detail == "0.000 over steps 1-5, 0.100 over steps 16-20 (at least +0.1 needed)"


def test_it_fails_learning_when_the_gain_is_smaller():
    rewards = {step: 0.2 for step in range(1, 16)} | {step: 0.29 for step in range(16, 21)}

    check = check_learning(rewards, model=SMOLLM2, max_steps=20)

    assert check.passed is False
    assert check.detail.startswith("0.200 over steps 1-5, 0.290 over steps 16-20")


def test_it_does_not_judge_learning_on_the_random_model_or_a_short_run():
    rising = {step: step / 20 for step in range(1, 21)}

    tiny = check_learning(rising, model="lab/tiny-random-llama", max_steps=20)
    short = check_learning({1: 0.0, 2: 0.5, 3: 1.0}, model=SMOLLM2, max_steps=3)

    assert tiny.passed is None and "random weights" in tiny.detail
    assert short.passed is None
    assert short.detail == "not checked: 3 steps with a reward, 10 needed"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEMO_PORT", "http", "DEMO_PORT must be an integer, not 'http'"),
        ("DEMO_PORT", "0", "DEMO_PORT must be at least 1, not 0"),
        ("DEMO_MAX_STEPS", "-3", "DEMO_MAX_STEPS must be at least 1, not -3"),
        ("DEMO_TIMEOUT_S", "1.5", "DEMO_TIMEOUT_S must be an integer, not '1.5'"),
    ],
)
def test_it_names_a_setting_it_cannot_use(tmp_path, name, value, message):
    with pytest.raises(DemoError) as raised:
        DemoSettings.from_environment({"LAB_DATA_DIR": str(tmp_path), name: value})

    assert str(raised.value) == message


def test_its_processes_get_loopback_webhooks_and_their_public_url(tmp_path):
    settings = DemoSettings.from_environment({"LAB_DATA_DIR": str(tmp_path), "DEMO_PORT": "8123"})

    env = settings.process_environment({"DATABASE_URL": "postgres://db/lab"})

    assert env["DATABASE_URL"] == "postgres://db/lab"
    assert env["LAB_PUBLIC_URL"] == "http://127.0.0.1:8123"
    assert env["LAB_WEBHOOK_ALLOW_PRIVATE"] == "1"
    assert env["LAB_DATA_DIR"] == str(tmp_path.resolve())
    assert env["LAB_MODEL_DIR"] == str(tmp_path.resolve() / "models")


def _signed(body: dict, *, webhook_id: str, secret: str = SECRET) -> tuple[bytes, dict[str, str]]:
    payload = json.dumps(body)
    now = datetime.now(UTC)
    signature = Webhook(secret).sign(webhook_id, now, payload)
    headers = {"webhook-id": webhook_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    return payload.encode(), headers


def test_the_receiver_verifies_signed_webhooks_and_flags_forged_ones():
    receiver = WebhookReceiver().start()
    receiver.secret = SECRET
    body = {"id": "evt_1", "type": "checkpoint.ready", "created_at": "2026-11-30T02:00:00Z", "data": {"step": 20}}
    try:
        genuine, genuine_headers = _signed(body, webhook_id="msg_1")
        forged, forged_headers = _signed({**body, "id": "evt_2"}, webhook_id="msg_2", secret="whsec_" + "A" * 44)
        answers = [
            httpx.post(receiver.url, content=genuine, headers=genuine_headers),
            httpx.post(receiver.url, content=genuine, headers=genuine_headers),  # a retry: same webhook-id
            httpx.post(receiver.url, content=forged, headers=forged_headers),
        ]
    finally:
        receiver.stop()

    assert [answer.status_code for answer in answers] == [204, 204, 204]
    received = receiver.snapshot()
    assert [(webhook.webhook_id, webhook.verified, webhook.type) for webhook in received] == [
        ("msg_1", True, "checkpoint.ready"),
        ("msg_2", False, None),
    ]
    assert received[0].body == body
    assert received[1].error == "No matching signature found"
