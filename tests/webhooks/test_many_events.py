"""1,000 events to 10 endpoints: each endpoint gets each subscribed event once, signature checked."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from jobs.models import JobEvent
from jobs.services import job_record_event, job_submit
from jobs.webhooks.endpoints import endpoint_create
from jobs.webhooks.events import WEBHOOK_EVENT_TYPES
from jobs.webhooks.models import WebhookDelivery
from lab.audit import Actor
from tests.webhooks.conftest import drain

pytestmark = pytest.mark.django_db

JOB_TYPES = ["job.started", "job.requeued", "job.succeeded", "job.failed", "job.cancelled"]


def test_1000_events_to_10_endpoints_all_arrive_verified_and_once(owner, spec, receiver):
    endpoints = {}
    for index in range(10):
        events = list(WEBHOOK_EVENT_TYPES) if index % 2 == 0 else ["job.started", "checkpoint.ready"]
        path = f"/endpoint-{index}"
        endpoint = endpoint_create(
            project=owner.project, actor=Actor(user=owner.user), data={"url": receiver.url(path), "events": events}
        )
        receiver.expect(path, endpoint.secret)
        endpoints[path] = endpoint
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    for index in range(999):
        kind = index % 6
        if kind == 5:
            job_record_event(job=job, type="checkpoint.ready", data={"checkpoint_id": f"ckpt_{index}", "step": index})
        else:
            job_record_event(job=job, type=JOB_TYPES[kind])
    events = list(JobEvent.objects.filter(job=job).values_list("public_id", "type"))
    assert len(events) == 1000
    expected = {
        path: {event_id for event_id, type in events if type in endpoint.events} for path, endpoint in endpoints.items()
    }
    total = sum(len(ids) for ids in expected.values())
    assert WebhookDelivery.objects.count() == total
    started = time.monotonic()
    results = drain()
    elapsed = time.monotonic() - started
    assert sum(result.succeeded for result in results) == total
    for path, ids in expected.items():
        received = receiver.at(path)
        assert all(item.verified for item in received), [item.error for item in received if not item.verified][:3]
        counts = Counter(item.event["id"] for item in received)
        assert set(counts) == ids, path
        assert max(counts.values()) == 1
    assert not WebhookDelivery.objects.exclude(status="succeeded").exists()
    print(f"{total} deliveries in {elapsed:.1f} s ({total / elapsed:.0f}/s)")
