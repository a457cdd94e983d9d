"""Tenant-owned querysets fail closed (lab.tenancy): unscoped queries raise, scoped ones see
their tenant only, and get_owned answers another tenant's id exactly like a missing one."""

from __future__ import annotations

import pytest

from jobs.models import Checkpoint, Job
from jobs.services import job_submit
from lab.api.errors import http_status, lab_error_body
from lab.audit import Actor
from lab.errors import LabError
from lab.tenancy import UnscopedQuery, get_owned

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def submit(tenant, spec) -> Job:
    return job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)


@pytest.mark.parametrize(
    "query",
    [
        lambda: list(Job.objects.all()),
        lambda: Job.objects.filter(status="queued").count(),
        lambda: Job.objects.exists(),
        lambda: Job.objects.filter(name="x").update(name="y"),
        lambda: Job.objects.all().delete(),
        lambda: Job.objects.get(public_id="job_x"),
        lambda: Job.objects.order_by("-id").first(),
        lambda: list(Job.objects.values_list("pk", flat=True)),
        lambda: list(Job.objects.all().iterator()),
        lambda: Checkpoint.objects.filter(step=1).exists(),
    ],
)
def test_it_refuses_a_query_without_a_tenant(owner, spec, query):
    submit(owner, spec)
    with pytest.raises(UnscopedQuery):
        query()


def test_scoped_queries_see_their_tenant_only(owner, outsider, member, spec):
    mine, theirs = submit(owner, spec), submit(outsider, spec)
    assert list(Job.objects.for_project(owner.project)) == [mine]
    assert list(owner.project.jobs.all()) == [mine]
    assert list(Job.objects.for_member(member)) == [mine]
    assert list(Job.objects.for_member(outsider.user)) == [theirs]
    assert sorted(Job.objects.unscoped().values_list("pk", flat=True)) == sorted([mine.pk, theirs.pk])


def test_get_owned_answers_a_foreign_id_as_a_missing_one(owner, outsider, spec):
    theirs = submit(outsider, spec)
    with pytest.raises(LabError) as foreign:
        get_owned(Job.objects.all(), owner.project, theirs.public_id, "job")
    with pytest.raises(LabError) as missing:
        get_owned(Job.objects.all(), owner.project, "job_doesnotexist", "job")
    assert lab_error_body(foreign.value) == lab_error_body(missing.value)
    assert (http_status(foreign.value), foreign.value.code) == (404, "not_found")
    assert get_owned(Job.objects.all(), outsider.project, theirs.public_id, "job") == theirs
