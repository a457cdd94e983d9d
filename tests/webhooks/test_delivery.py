"""Delivery through the outbox to a real local receiver that verifies every signature."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest
from labsdk.webhooks import WebhookReceiver, WebhookVerificationError, verify
from standardwebhooks import Webhook

from jobs.models import Checkpoint, JobEvent
from jobs.services import job_record_event, job_submit
from jobs.webhooks.delivery import claim_deliveries, deliver, endpoint_disable, lease, signature_headers
from jobs.webhooks.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_rotate_secret,
    endpoint_update,
    new_secret,
)
from jobs.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookMessage
from jobs.webhooks.sweep import purge_finished, sweep
from lab.api.errors import http_status
from lab.audit import Actor
from lab.errors import LabError
from tests.support import http_server
from tests.webhooks.conftest import drain

pytestmark = pytest.mark.django_db


def endpoint_for(tenant, receiver, path="/hook", events=None, answers=None) -> WebhookEndpoint:
    body = {"url": receiver.url(path)}
    if events is not None:
        body["events"] = events
    endpoint = endpoint_create(project=tenant.project, actor=Actor(user=tenant.user), data=body)
    receiver.expect(path, endpoint.secret, answers)
    return endpoint


def submit(tenant, spec):
    return job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)


def test_a_job_event_arrives_signed_with_the_job_object(owner, spec, receiver):
    endpoint_for(owner, receiver)
    job = submit(owner, spec)
    event = JobEvent.objects.get(job=job, type="job.queued")
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == DeliveryStatus.PENDING
    [result] = drain()
    assert result.succeeded
    [received] = receiver.at("/hook")
    assert received.verified, received.error
    assert received.headers["webhook-id"] == delivery.public_id
    assert received.headers["content-type"] == "application/json"
    assert received.headers["webhook-signature"].startswith("v1,")
    body = received.event
    assert list(body) == ["id", "type", "created_at", "data"]
    assert body["id"] == event.public_id and body["type"] == "job.queued"
    assert body["created_at"].endswith("Z")
    assert body["data"]["id"] == job.public_id and body["data"]["object"] == "job"
    assert body["data"]["status"] == "queued"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempt_count, delivery.last_status_code) == ("succeeded", 1, 200)
    [attempt] = delivery.attempts.all()
    assert attempt.status_code == 200 and attempt.succeeded and attempt.response_excerpt == '{"ok": true}'
    assert attempt.request_headers["webhook-id"] == delivery.public_id
    assert verify(received.body, received.headers, WebhookEndpoint.objects.unscoped().get().secret)["id"] == event.public_id


def test_only_subscribed_event_types_of_the_projects_enabled_endpoints_are_sent(owner, outsider, spec, receiver):
    endpoint_for(owner, receiver, "/only-succeeded", events=["job.succeeded"])
    disabled = endpoint_for(owner, receiver, "/disabled")
    WebhookEndpoint.objects.unscoped().filter(pk=disabled.pk).update(enabled=False)
    endpoint_for(outsider, receiver, "/outsider")
    job = submit(owner, spec)
    job_record_event(job=job, type="job.starting")
    job_record_event(job=job, type="job.succeeded")
    drain()
    assert [r.event["type"] for r in receiver.at("/only-succeeded")] == ["job.succeeded"]
    assert receiver.at("/disabled") == [] and receiver.at("/outsider") == []
    assert WebhookMessage.objects.filter(type="job.starting").count() == 0


def test_checkpoint_ready_carries_job_checkpoint_step_and_download_url(owner, spec, receiver, settings):
    settings.LAB_PUBLIC_URL = "https://lab.example.com"
    endpoint_for(owner, receiver, events=["checkpoint.ready"])
    job = submit(owner, spec)
    checkpoint = Checkpoint.objects.create(job=job, step=2, attempt=1, format="peft-lora", status="ready")
    job_record_event(job=job, type="checkpoint.ready", data={"checkpoint_id": checkpoint.public_id, "step": 2})
    drain()
    [received] = receiver.at("/hook")
    assert received.verified
    assert received.event["data"] == {
        "job_id": job.public_id,
        "checkpoint_id": checkpoint.public_id,
        "step": 2,
        "download_url": f"https://lab.example.com/api/v1/checkpoints/{checkpoint.public_id}/download",
    }


def test_a_receiver_down_for_its_first_attempts_still_gets_the_event_with_the_same_webhook_id(
    owner, spec, clock, settings
):
    settings.LAB_WEBHOOK_RETRY_SCHEDULE = [0, 5, 300, 1800]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = endpoint_create(
        project=owner.project, actor=Actor(user=owner.user), data={"url": f"http://127.0.0.1:{port}/hook"}
    )
    submit(owner, spec)
    delivery = WebhookDelivery.objects.get()
    [first] = drain(clock.now)
    assert not first.succeeded and first.retryable and "connection failed" in first.error
    assert drain(clock.now) == []  # the retry is not due yet
    [second] = drain(clock.advance(6))
    assert not second.succeeded
    with WebhookReceiver(port=port) as receiver:
        receiver.expect("/hook", endpoint.secret)
        assert drain(clock.advance(200)) == []
        [third] = drain(clock.advance(140))
        assert third.succeeded
        [received] = receiver.at("/hook")
    assert received.verified and received.headers["webhook-id"] == delivery.public_id
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempt_count) == ("succeeded", 3)
    attempts = list(delivery.attempts.order_by("number").values_list("number", "status_code", "succeeded"))
    assert attempts == [(1, None, False), (2, None, False), (3, 200, True)]
    assert all(a.request_headers["webhook-id"] == delivery.public_id for a in delivery.attempts.all())


def test_a_400_answer_is_not_retried(owner, spec, receiver, clock):
    endpoint_for(owner, receiver, answers=[(400, 0)])
    submit(owner, spec)
    [result] = drain(clock.now)
    assert not result.succeeded and not result.retryable and result.status_code == 400
    assert drain(clock.advance(10 * 24 * 3600)) == []
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempt_count, delivery.next_attempt_at) == ("failed", 1, None)
    assert len(receiver.at("/hook")) == 1
    assert delivery.attempts.get().response_excerpt == '{"ok": false}'


@pytest.mark.parametrize("status", [429, 500, 503])
def test_429_and_5xx_answers_are_retried(owner, spec, receiver, clock, status):
    endpoint_for(owner, receiver, answers=[(status, 0)])
    submit(owner, spec)
    [first] = drain(clock.now)
    assert first.retryable and first.status_code == status
    [second] = drain(clock.advance(6))
    assert second.succeeded
    received = receiver.at("/hook")
    assert len(received) == 2 and received[0].webhook_id == received[1].webhook_id
    assert all(r.verified for r in received)


def test_a_slow_receiver_is_timed_out_and_retried(owner, spec, receiver, clock, settings):
    settings.LAB_WEBHOOK_TIMEOUT_S = 1
    endpoint_for(owner, receiver, answers=[(200, 2.5)])
    submit(owner, spec)
    [first] = drain(clock.now)
    assert not first.succeeded and first.retryable and first.error.startswith("timed out")
    assert 900 <= first.duration_ms < 2400
    [second] = drain(clock.advance(6))
    assert second.succeeded
    received = receiver.at("/hook")
    assert len(received) == 2 and received[0].webhook_id == received[1].webhook_id


def test_a_delivery_whose_schedule_runs_out_fails(owner, spec, receiver, clock, settings):
    settings.LAB_WEBHOOK_RETRY_SCHEDULE = [0, 5]
    endpoint_for(owner, receiver, answers=[(500, 0), (500, 0), (200, 0)])
    submit(owner, spec)
    drain(clock.now)
    drain(clock.advance(6))
    assert drain(clock.advance(3600)) == []
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempt_count) == ("failed", 2)


def test_a_worker_killed_mid_delivery_leads_to_a_retry_after_the_lease(owner, spec, receiver, clock):
    endpoint_for(owner, receiver)
    submit(owner, spec)
    [claimed] = claim_deliveries(None, now=clock.now)  # ...and the worker dies here
    assert claim_deliveries(None, now=clock.advance(30)) == []  # still held by the lease
    [result] = drain(clock.advance(lease().total_seconds()))
    assert result.succeeded and result.delivery_id == claimed.pk
    [received] = receiver.at("/hook")
    assert received.webhook_id == claimed.public_id and received.verified


def test_the_sweep_queues_due_retries_and_leaves_fresh_deliveries_to_their_task(
    owner, spec, receiver, clock, monkeypatch
):
    queued: list[tuple] = []
    monkeypatch.setattr("lab.dispatch.send", lambda name, *args, **options: queued.append((name, args, options)))
    endpoint_for(owner, receiver)
    submit(owner, spec)
    assert sweep(now=clock.now) == 0
    assert sweep(now=clock.advance(10)) == 0
    assert sweep(now=clock.advance(6)) == 1
    assert queued == [("jobs.webhooks.deliver", ([WebhookDelivery.objects.get().pk],), {})]


def test_an_endpoint_failing_for_5_days_is_disabled_with_an_event_to_the_others(owner, spec, receiver, clock):
    failing = endpoint_for(owner, receiver, "/failing", answers=[(500, 0)] * 100)
    endpoint_for(owner, receiver, "/ops", events=["webhook_endpoint.disabled"])
    job = submit(owner, spec)
    drain(clock.now)
    failing.refresh_from_db()
    assert failing.failing_since == clock.now and failing.enabled
    clock.advance(4 * 24 * 3600)
    job_record_event(job=job, type="job.started")
    drain(clock.now)
    failing.refresh_from_db()
    assert failing.enabled
    clock.advance(24 * 3600 + 1)
    job_record_event(job=job, type="job.succeeded")
    drain(clock.now)
    failing.refresh_from_db()
    assert (failing.enabled, failing.disabled_reason) == (False, "failing_for_5_days")
    assert not WebhookDelivery.objects.filter(endpoint=failing, status="pending").exists()
    [notice] = receiver.at("/ops")
    assert notice.verified
    assert notice.event["type"] == "webhook_endpoint.disabled"
    assert notice.event["data"] == {
        "id": failing.public_id,
        "object": "webhook_endpoint",
        "url": failing.url,
        "events": failing.events,
        "enabled": False,
        "created_at": notice.event["data"]["created_at"],
    }
    job_record_event(job=job, type="job.failed")
    drain(clock.advance(10))
    assert not WebhookDelivery.objects.filter(endpoint=failing, message__type="job.failed").exists()


def test_a_success_resets_the_failure_clock(owner, spec, receiver, clock):
    endpoint = endpoint_for(owner, receiver, answers=[(500, 0)])
    submit(owner, spec)
    drain(clock.now)
    endpoint.refresh_from_db()
    assert endpoint.failing_since is not None
    drain(clock.advance(6))
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None


def test_after_a_rotation_both_secrets_sign_for_24_hours(owner, spec, receiver, clock):
    endpoint = endpoint_for(owner, receiver)
    old_secret = endpoint.secret
    endpoint = endpoint_rotate_secret(endpoint=endpoint, actor=Actor(user=owner.user), now=clock.now)
    receiver.expect("/hook", endpoint.secret)
    submit(owner, spec)
    drain(clock.now)
    [received] = receiver.at("/hook")
    assert received.verified
    assert len(received.headers["webhook-signature"].split(" ")) == 2
    Webhook(old_secret).verify(received.body, received.headers)
    delivery = WebhookDelivery.objects.get()
    later = signature_headers(delivery, now=clock.now + timedelta(hours=25))
    assert len(later["webhook-signature"].split(" ")) == 1


def test_redeliver_sends_the_same_message_again(owner, spec, receiver, clock):
    endpoint = endpoint_for(owner, receiver)
    submit(owner, spec)
    drain(clock.now)
    delivery = WebhookDelivery.objects.get()
    delivery_redeliver(delivery=delivery, actor=Actor(user=owner.user), now=clock.advance(60))
    drain(clock.now)
    first, second = receiver.at("/hook")
    assert first.body == second.body and first.webhook_id == second.webhook_id == delivery.public_id
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempt_count, WebhookAttempt.objects.count()) == ("succeeded", 2, 2)
    assert endpoint.deliveries.count() == 1


def test_the_test_button_sends_a_signed_webhook_test_event(owner, receiver):
    endpoint = endpoint_for(owner, receiver, events=["job.failed"])
    response = owner.client().post(f"/api/v1/webhook-endpoints/{endpoint.public_id}/test")
    assert response.status_code == 202
    drain()
    [received] = receiver.at("/hook")
    assert received.verified
    assert received.event["type"] == "webhook.test"
    assert received.event["id"].startswith("evt_")
    assert received.event["data"]["endpoint_id"] == endpoint.public_id
    listed = owner.client().get(f"/api/v1/webhook-endpoints/{endpoint.public_id}/deliveries").json()["data"]
    assert listed[0]["status"] == "succeeded"
    assert listed[0]["attempts"][0]["status_code"] == 200
    assert listed[0]["attempts"][0]["duration_ms"] >= 0
    assert json.loads(listed[0]["request_body"]) == received.event


def test_the_sdk_refuses_a_tampered_body_a_wrong_secret_and_missing_headers(owner, spec, receiver):
    endpoint = endpoint_for(owner, receiver)
    submit(owner, spec)
    drain()
    [received] = receiver.at("/hook")
    assert verify(received.body.decode(), list(received.headers.items()), endpoint.secret)["type"] == "job.queued"
    with pytest.raises(WebhookVerificationError):
        verify(received.body.replace(b"queued", b"failed"), received.headers, endpoint.secret)
    with pytest.raises(WebhookVerificationError):
        verify(received.body, received.headers, new_secret())
    with pytest.raises(WebhookVerificationError):
        verify(received.body, {"webhook-id": received.webhook_id}, endpoint.secret)
    with pytest.raises(WebhookVerificationError):
        verify(received.body, received.headers, "not a secret!")


def test_deleting_the_job_keeps_its_pending_webhooks(owner, spec, receiver):
    endpoint_for(owner, receiver)
    job = submit(owner, spec)
    job.delete()
    drain()
    [received] = receiver.at("/hook")
    assert received.verified and received.event["data"]["id"] == job.public_id


def test_an_answer_with_nul_bytes_is_stored(owner, spec, clock):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = b"bad\x00answer"
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with http_server.serving(server):
        endpoint_create(
            project=owner.project,
            actor=Actor(user=owner.user),
            data={"url": f"http://127.0.0.1:{server.server_address[1]}/hook"},
        )
        submit(owner, spec)
        [result] = drain(clock.now)
    assert result.status_code == 400
    assert WebhookAttempt.objects.get().response_excerpt == "bad\ufffdanswer"


def test_a_redirect_is_not_followed_and_not_retried(owner, spec, receiver, clock):
    endpoint_for(owner, receiver, answers=[(301, 0)])
    submit(owner, spec)
    [result] = drain(clock.now)
    assert (result.succeeded, result.retryable, result.status_code) == (False, False, 301)
    assert drain(clock.advance(3600)) == []
    assert WebhookDelivery.objects.get().status == "failed"


def test_an_endpoint_whose_name_now_resolves_to_a_private_address_gets_nothing(
    owner, spec, receiver, clock, settings, monkeypatch
):
    import socket as socket_module

    from lab.lib import http

    endpoint = endpoint_for(owner, receiver)
    WebhookEndpoint.objects.unscoped().filter(pk=endpoint.pk).update(url=f"http://hooks.example:{receiver.port}/hook")
    real = socket_module.getaddrinfo
    monkeypatch.setattr(
        http.socket,
        "getaddrinfo",
        lambda host, port, *a, **k: [(socket_module.AF_INET, socket_module.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        if host == "hooks.example"
        else real(host, port, *a, **k),
    )
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = False
    submit(owner, spec)
    [result] = drain(clock.now)
    assert not result.succeeded and not result.retryable
    assert result.error.startswith("refused:")
    assert receiver.at("/hook") == []
    assert WebhookDelivery.objects.get().status == "failed"


def test_enabling_a_disabled_endpoint_again_forgets_its_failures_and_redeliver_needs_it_enabled(owner, spec, receiver):
    endpoint = endpoint_for(owner, receiver, answers=[(500, 0)])
    submit(owner, spec)
    drain()
    delivery = WebhookDelivery.objects.get()
    assert endpoint_disable(endpoint=endpoint, reason="test") is True
    assert endpoint_disable(endpoint=endpoint, reason="test") is False
    delivery.refresh_from_db()
    assert (delivery.status, delivery.last_error) == ("failed", "endpoint disabled")
    with pytest.raises(LabError) as refused:
        delivery_redeliver(delivery=delivery, actor=Actor(user=owner.user))
    assert http_status(refused.value) == 409
    endpoint = endpoint_update(endpoint=endpoint, actor=Actor(user=owner.user), data={"enabled": True})
    assert (endpoint.enabled, endpoint.failing_since, endpoint.disabled_reason) == (True, None, "")
    delivery_redeliver(delivery=delivery, actor=Actor(user=owner.user))
    [result] = drain()
    assert result.succeeded
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempt_count) == ("succeeded", 2)


def test_finished_deliveries_are_purged_after_30_days_and_pending_ones_kept(owner, spec, receiver, clock):
    endpoint_for(owner, receiver, "/ok")
    endpoint_for(owner, receiver, "/down", answers=[(500, 0)])
    submit(owner, spec)
    drain(clock.now)
    assert purge_finished(now=clock.advance(29 * 24 * 3600)) == 0
    assert purge_finished(now=clock.advance(2 * 24 * 3600)) == 0  # one delivery is still pending
    WebhookDelivery.objects.filter(status="pending").update(status="failed")
    assert purge_finished(now=clock.now) == 1
    assert not WebhookMessage.objects.exists()
    assert not WebhookDelivery.objects.exists() and not WebhookAttempt.objects.exists()


@pytest.mark.parametrize(
    ("stored_url", "error"),
    [
        ("http://\u2460\u2461\u2466.0.0.1:{port}/hook", "refused: The URL's host is not a valid host name (IDNA 2008)."),
        ("http://127.0.0.1.:{port}/hook", "refused: The URL's host may not end with a dot."),
        (
            "http://[2002:a9fe:a9fe::]:{port}/hook",
            "refused: 2002:a9fe:a9fe:: resolves to a refused address (2002:a9fe:a9fe::, which carries 169.254.169.254).",
        ),
    ],
)
def test_an_endpoint_whose_stored_url_can_never_be_sent_is_disabled_without_retries(
    owner, spec, receiver, clock, caplog, stored_url, error
):
    """A URL stored before the rules refused it fails once, and its endpoint is disabled with an event."""
    broken = endpoint_for(owner, receiver, "/hook")
    WebhookEndpoint.objects.unscoped().filter(pk=broken.pk).update(url=stored_url.format(port=receiver.port))
    endpoint_for(owner, receiver, "/ops", events=["webhook_endpoint.disabled"])
    job = submit(owner, spec)
    job_record_event(job=job, type="job.started")
    first = WebhookDelivery.objects.get(endpoint=broken, message__type="job.queued")
    [result] = deliver([first.pk], now=clock.now)
    assert (result.succeeded, result.retryable, result.status_code, result.error) == (False, False, None, error)
    drain(clock.now)
    broken.refresh_from_db()
    assert (broken.enabled, broken.disabled_reason) == (False, "invalid_url")
    assert broken.failing_since is None
    deliveries = WebhookDelivery.objects.filter(endpoint=broken).order_by("pk")
    assert [(d.message.type, d.status, d.attempt_count) for d in deliveries] == [
        ("job.queued", "failed", 1),
        ("job.started", "failed", 0),
    ]
    assert [d.last_error for d in deliveries] == [error, "endpoint disabled"]
    assert WebhookAttempt.objects.filter(delivery__endpoint=broken).count() == 1
    assert receiver.at("/hook") == []
    [notice] = receiver.at("/ops")
    assert notice.verified
    assert notice.event["type"] == "webhook_endpoint.disabled"
    assert (notice.event["data"]["id"], notice.event["data"]["enabled"]) == (broken.public_id, False)
    assert [record for record in caplog.records if record.levelname in ("ERROR", "CRITICAL")] == []
    assert drain(clock.advance(3600)) == []
    job_record_event(job=job, type="job.succeeded")
    assert drain(clock.advance(10)) == []
    assert not WebhookDelivery.objects.filter(endpoint=broken, message__type="job.succeeded").exists()
