"""List endpoints and the project page read a page of jobs in a constant number of queries."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.artifacts import lifecycle
from jobs.artifacts.kinds import CHECKPOINT
from jobs.models import Checkpoint, CheckpointStatus, Job, JobStatus
from jobs.serializers import job_to_dict, latest_ready_checkpoints_read_once
from jobs.services import job_claim_for_start, job_record_event, job_submit, job_transition
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def add_jobs(tenant, spec, count: int) -> None:
    """Half queued, half running with a ready checkpoint (so every field has something to read)."""
    for index in range(count):
        job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
        if index % 2:
            attempt = job_claim_for_start(job_id=job.pk)
            job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.RUNNING)
            with transaction.atomic():
                checkpoint, _ = lifecycle.register(CHECKPOINT, job=job, attempt=attempt, step=1, format="peft-lora")
            Checkpoint.objects.unscoped().filter(pk=checkpoint.pk).update(status=CheckpointStatus.READY, size_bytes=1, sha256="0" * 64)


def count_queries(call) -> int:
    call()  # once to warm what a first request reads only once (the key's last use, caches)
    with CaptureQueriesContext(connection) as queries:
        response = call()
    assert response.status_code == 200, response.content[:500]
    return len(queries)


def test_the_jobs_list_takes_as_many_queries_for_100_jobs_as_for_4(owner, spec):
    client = owner.client()
    add_jobs(owner, spec, 4)
    few = count_queries(lambda: client.get("/api/v1/jobs?limit=100"))
    add_jobs(owner, spec, 96)
    many = count_queries(lambda: client.get("/api/v1/jobs?limit=100"))
    assert len(client.get("/api/v1/jobs?limit=100").json()["data"]) == 100
    assert many == few
    assert many <= 12


def test_the_events_and_checkpoints_lists_take_a_constant_number_of_queries(owner, spec):
    client = owner.client()
    add_jobs(owner, spec, 2)
    job = Job.objects.unscoped().filter(project=owner.project, status=JobStatus.RUNNING).first()
    events = count_queries(lambda: client.get(f"/api/v1/jobs/{job.public_id}/events?limit=100"))
    checkpoints = count_queries(lambda: client.get(f"/api/v1/jobs/{job.public_id}/checkpoints?limit=100"))
    with transaction.atomic():
        for number in range(20):
            job_record_event(job=job, type="job.data_incomplete", message=f"warning {number}")
    assert count_queries(lambda: client.get(f"/api/v1/jobs/{job.public_id}/events?limit=100")) == events
    assert count_queries(lambda: client.get(f"/api/v1/jobs/{job.public_id}/checkpoints?limit=100")) == checkpoints


def test_the_project_page_takes_as_many_queries_for_a_full_page_of_jobs_as_for_two(owner, spec, client):
    client.force_login(owner.user)
    url = f"/o/{owner.organization.slug}/p/{owner.project.slug}/"
    add_jobs(owner, spec, 2)
    few = count_queries(lambda: client.get(url))
    add_jobs(owner, spec, 60)
    assert count_queries(lambda: client.get(url)) == few


def test_job_objects_made_inside_latest_ready_checkpoints_read_once_are_the_same_from_one_read(owner, spec):
    add_jobs(owner, spec, 4)
    jobs = list(Job.objects.unscoped().filter(project=owner.project).order_by("pk"))
    alone = [job_to_dict(job) for job in jobs]

    with CaptureQueriesContext(connection) as queries, latest_ready_checkpoints_read_once(jobs):
        inside = [job_to_dict(job) for job in jobs]

    assert inside == alone
    assert [bool(job["latest_checkpoint"]) for job in inside] == [False, True, False, True]
    assert len([query for query in queries if 'FROM "jobs_checkpoint"' in query["sql"]]) == 1
