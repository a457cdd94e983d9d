"""End to end: a job on the tiny model in the real stack (uvicorn, Celery worker with beat, the
engine) sends job and checkpoint webhooks that verify with ``standardwebhooks``."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection  # noqa: F401  (used by the skipif expression)

from labsdk.webhooks import verify
from tests.stack import LabStack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the stack shares a PostgreSQL test database"),
]


def test_a_tiny_job_with_checkpoints_sends_verified_webhooks_through_the_worker(owner, spec, receiver, tmp_path, settings):
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
            return [r for r in receiver.at("/lab") if r.event["type"] in {"job.succeeded", "job.failed"}]

        try:
            wait_for(finished, timeout=240, what="the job's final webhook")
        except AssertionError:
            raise AssertionError(f"{api.get(f'/jobs/{job_id}').text}\n{stack.logs()}") from None
        received = receiver.at("/lab")
        assert all(item.verified for item in received), [item.error for item in received]
        for item in received:
            assert verify(item.body, item.headers, secret)["id"] == item.event["id"]
        types = [item.event["type"] for item in received]
        assert types[0] == "job.queued" and types[-1] == "job.succeeded", types
        assert "job.started" in types
        checkpoints = [item.event["data"] for item in received if item.event["type"] == "checkpoint.ready"]
        assert [data["step"] for data in checkpoints] == [1, 2, 3]
        for data in checkpoints:
            assert data["job_id"] == job_id
            assert data["download_url"] == f"{stack.base_url}/api/v1/checkpoints/{data['checkpoint_id']}/download"
        succeeded = received[-1].event["data"]
        assert succeeded["id"] == job_id and succeeded["status"] == "succeeded"
        assert len({item.webhook_id for item in received}) == len(received)
        deliveries = api.get(f"/webhook-endpoints/{created.json()['id']}/deliveries?limit=100").json()["data"]
        assert len(deliveries) == len(received)
        assert {delivery["status"] for delivery in deliveries} == {"succeeded"}
    finally:
        stack.stop()
