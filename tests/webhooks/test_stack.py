"""End to end: a job on the tiny model in the real stack (uvicorn, Celery worker with beat, the
engine) sends job and checkpoint webhooks that verify with ``standardwebhooks``."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection  # noqa: F401  (used by the skipif expression)
from labsdk.webhooks import verify

from tests.support.stack import LabStack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the stack shares a PostgreSQL test database"),
]


def test_a_tiny_job_with_checkpoints_sends_verified_webhooks_through_the_worker(
    owner, spec, receiver, tmp_path, settings
):
    stack = LabStack(tmp_path / "lab", LAB_WEBHOOK_ALLOW_PRIVATE="1")
    settings.LAB_DATA_DIR = stack.data_dir
    try:
        stack.start()
        api = httpx.Client(
            base_url=f"{stack.base_url}/api/v1", headers={"Authorization": f"Bearer {owner.key}"}, timeout=30
        )
        created = api.post("/webhook-endpoints", json={"url": receiver.url("/lab")})
        assert created.status_code == 201, created.text
        secret = created.json()["secret"]
        receiver.expect("/lab", secret)
        spec.update(max_steps=3, checkpoints={"interval": 1, "keep_last": 3})
        response = api.post("/jobs", json=spec)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]

        def finished():
            types = [r.type for r in receiver.at("/lab")]
            return "job.succeeded" in types and types.count("checkpoint.ready") >= 3

        try:
            wait_for(finished, timeout=240, what="the job's webhooks")
        except AssertionError:
            arrived = [r.type or r.error for r in receiver.at("/lab")]
            raise AssertionError(f"{arrived}\n{api.get(f'/jobs/{job_id}').text}\n{stack.logs()}") from None
        arrivals = receiver.at("/lab")
        assert all(item.verified for item in arrivals), [item.error for item in arrivals]
        for item in arrivals:
            assert verify(item.body, item.headers, secret)["id"] == item.event["id"]
        # A receiver drops repeats by webhook-id (a retry after a lost answer may repeat one).
        received = list({item.webhook_id: item for item in arrivals}.values())
        # Webhooks promise at-least-once delivery, not order (as Svix): compare as multisets.
        types = sorted(item.event["type"] for item in received)
        assert types == sorted(["job.queued", "job.started", "job.succeeded"] + ["checkpoint.ready"] * 3), types
        checkpoints = [item.event["data"] for item in received if item.event["type"] == "checkpoint.ready"]
        assert sorted(data["step"] for data in checkpoints) == [1, 2, 3]
        for data in checkpoints:
            assert data["job_id"] == job_id
            assert data["download_url"] == f"{stack.base_url}/api/v1/checkpoints/{data['checkpoint_id']}/download"
        [succeeded] = [item.event["data"] for item in received if item.event["type"] == "job.succeeded"]
        assert succeeded["id"] == job_id and succeeded["status"] == "succeeded"
        assert len({item.event["id"] for item in received}) == len(received)

        def recorded():
            deliveries = api.get(f"/webhook-endpoints/{created.json()['id']}/deliveries?limit=100").json()["data"]
            return deliveries if {delivery["status"] for delivery in deliveries} == {"succeeded"} else None

        deliveries = wait_for(recorded, timeout=30, what="every delivery recorded as succeeded")
        assert len(deliveries) == len(received)
    finally:
        stack.stop()


def test_a_worker_killed_mid_delivery_leads_to_a_retry_with_the_same_webhook_id(
    owner, spec, receiver, tmp_path, settings
):
    from django.db import transaction

    from jobs.models import Job
    from jobs.services import job_record_event
    from jobs.webhooks.endpoints import endpoint_create
    from jobs.webhooks.models import WebhookDelivery
    from lab.audit import Actor

    # Lease = 2 x 5 s + 5 s: the sweep hands the delivery to the new worker about 15 s after the claim.
    stack = LabStack(tmp_path / "lab", LAB_WEBHOOK_ALLOW_PRIVATE="1", LAB_WEBHOOK_TIMEOUT_S="5", LAB_WEBHOOK_LEASE_MARGIN_S="5")
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        stack.start_worker()
        endpoint = endpoint_create(
            project=owner.project,
            actor=Actor(user=owner.user),
            data={"url": receiver.url("/slow"), "events": ["job.started"]},
        )
        receiver.expect("/slow", endpoint.secret, answers=[(200, 4.5)])
        # Cancelled, so the running worker's admission leaves it alone: only this event is sent.
        job = Job.objects.create(
            project=owner.project, spec={}, model="lab/tiny-random-llama", max_steps=1, status="cancelled"
        )
        with transaction.atomic():
            job_record_event(job=job, type="job.started")
        wait_for(lambda: receiver.at("/slow"), timeout=60, what="the first try to reach the receiver")
        stack.kill("worker")  # mid-request: the receiver has not answered yet
        stack.start_worker()
        wait_for(lambda: len(receiver.at("/slow")) >= 2, timeout=120, what="the retry after the lease")
        delivery = WebhookDelivery.objects.get(endpoint=endpoint)
        wait_for(
            lambda: WebhookDelivery.objects.filter(pk=delivery.pk, status="succeeded").exists(),
            timeout=30,
            what="the delivery to be recorded",
        )
        first, second = receiver.at("/slow")[:2]
        assert first.verified and second.verified
        assert first.webhook_id == second.webhook_id == delivery.public_id
        assert first.body == second.body
        delivery.refresh_from_db()
        assert delivery.attempt_count == 2
        assert list(delivery.attempts.values_list("number", "status_code")) == [(2, 200)]
    finally:
        stack.stop()
