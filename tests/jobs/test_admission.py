"""Admission: order (priority, fair share, age), caps, pool room, and claiming exactly once."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from jobs.admission import admission_pass
from jobs.models import Job, JobAttempt, JobEvent, JobStatus
from jobs.services import job_submit
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


def submit(tenant, spec, **changes) -> Job:
    return job_submit(project=tenant.project, actor=Actor(user=tenant.user), data={**spec, **changes})


def statuses(*jobs: Job) -> list[str]:
    return [Job.objects.unscoped().get(pk=job.pk).status for job in jobs]


def test_it_starts_jobs_up_to_the_local_slots_and_explains_the_rest(owner, spec, settings):
    settings.LAB_LOCAL_SLOTS = 2
    jobs = [submit(owner, spec) for _ in range(3)]
    result = admission_pass()
    assert result.started == [jobs[0].pk, jobs[1].pk]
    assert statuses(*jobs) == ["starting", "starting", "queued"]
    waiting = Job.objects.unscoped().get(pk=jobs[2].pk)
    assert waiting.status_reason == "pool_full"
    assert [a.number for a in JobAttempt.objects.filter(job=jobs[0])] == [1]
    assert JobEvent.objects.filter(job=jobs[0], type="job.starting").count() == 1
    assert admission_pass().started == []


def test_the_organization_cap_holds_and_can_be_lowered(owner, outsider, spec, settings):
    settings.LAB_LOCAL_SLOTS = 10
    settings.LAB_ORG_MAX_RUNNING_JOBS = 3
    owner.organization.max_running_jobs = 1
    owner.organization.save()
    mine = [submit(owner, spec) for _ in range(2)]
    theirs = [submit(outsider, spec) for _ in range(4)]
    admission_pass()
    assert statuses(*mine) == ["starting", "queued"]
    assert Job.objects.unscoped().get(pk=mine[1].pk).status_reason == "org_concurrency_limit"
    assert statuses(*theirs) == ["starting", "starting", "starting", "queued"]


def test_priority_first_then_fair_share_then_age(owner, outsider, spec, settings):
    settings.LAB_LOCAL_SLOTS = 1
    settings.LAB_ORG_MAX_RUNNING_JOBS = 10
    busy = submit(owner, spec)
    admission_pass()
    assert statuses(busy) == ["starting"]
    older_from_busy_org = submit(owner, spec)
    newer_from_idle_org = submit(outsider, spec)
    urgent = submit(owner, spec, priority="high")
    # Free the slot: the high-priority job goes first even though it is the newest.
    Job.objects.unscoped().filter(pk=busy.pk).update(status=JobStatus.SUCCEEDED)
    admission_pass()
    assert statuses(urgent, older_from_busy_org, newer_from_idle_org) == ["starting", "queued", "queued"]
    # Now the owner's organization runs something and the outsider's runs nothing: fair share
    # admits the outsider's newer job before the owner's older one.
    settings.LAB_LOCAL_SLOTS = 2
    admission_pass()
    assert statuses(older_from_busy_org, newer_from_idle_org) == ["queued", "starting"]


def test_queue_positions_shrink_as_jobs_start(owner, spec, settings):
    settings.LAB_LOCAL_SLOTS = 1
    jobs = [submit(owner, spec) for _ in range(3)]
    positions = [owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["queue_position"] for job in jobs]
    assert positions == [1, 2, 3]
    admission_pass()
    positions = [owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["queue_position"] for job in jobs]
    assert positions == [None, 1, 2]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs concurrent connections")
@pytest.mark.django_db(transaction=True)  # threads, each on its own connection
def test_two_concurrent_passes_never_overcommit_or_claim_twice(owner, spec, settings):
    settings.LAB_LOCAL_SLOTS = 3
    settings.LAB_ORG_MAX_RUNNING_JOBS = 10
    jobs = [submit(owner, spec) for _ in range(8)]
    errors: list[Exception] = []

    def run():
        try:
            admission_pass()
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Job.objects.unscoped().filter(status=JobStatus.STARTING).count() == 3
    assert JobAttempt.objects.count() == 3
    assert all(JobAttempt.objects.filter(job=job).count() <= 1 for job in jobs)
