"""Events recorded inside ``endpoints_read_once`` (the reconciler finishing many jobs at once)
get the same deliveries as on their own, from one read of the endpoints for all of them."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.services import job_record_event, job_submit
from jobs.webhooks.models import WebhookDelivery, WebhookEndpoint
from jobs.webhooks.outbox import endpoints_read_once
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def endpoint(tenant, events: list[str], *, enabled: bool = True) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(project=tenant.project, url="http://127.0.0.1:9/x", secret="whsec_x",
                                          events=events, enabled=enabled)


def delivered_to(event) -> list[int]:
    return list(WebhookDelivery.objects.filter(message__job_event=event).order_by("pk").values_list("endpoint_id", flat=True))


def test_it_delivers_to_the_same_endpoints_as_without_it_from_one_read(owner, outsider, spec):
    both = endpoint(owner, ["job.succeeded", "job.data_incomplete"])
    endpoint(owner, ["job.failed"])
    endpoint(owner, ["job.succeeded"], enabled=False)
    later = endpoint(owner, ["job.succeeded"])
    theirs = endpoint(outsider, ["job.succeeded"])
    jobs = [job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec) for _ in range(3)]
    their_job = job_submit(project=outsider.project, actor=Actor(user=outsider.user), data=spec)
    alone = job_record_event(job=jobs[0], type="job.succeeded")

    with transaction.atomic(), CaptureQueriesContext(connection) as queries, endpoints_read_once([owner.project.pk]):
        succeeded = [job_record_event(job=job, type="job.succeeded") for job in jobs]
        incomplete = job_record_event(job=jobs[1], type="job.data_incomplete")
        outside_the_set = job_record_event(job=their_job, type="job.succeeded")

    assert delivered_to(alone) == [both.pk, later.pk]
    assert [delivered_to(event) for event in succeeded] == [[both.pk, later.pk]] * 3
    assert delivered_to(incomplete) == [both.pk]
    assert delivered_to(outside_the_set) == [theirs.pk]  # a project outside the set is read as before
    endpoint_reads = [query for query in queries if 'FROM "jobs_webhookendpoint"' in query["sql"]]
    assert len(endpoint_reads) == 2  # the block's one read, and the outsider's project on its own


def test_it_reads_each_event_s_endpoints_again_once_the_block_ends(owner, spec):
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    with endpoints_read_once([owner.project.pk]):
        pass
    added = endpoint(owner, ["job.succeeded"])

    assert delivered_to(job_record_event(job=job, type="job.succeeded")) == [added.pk]
