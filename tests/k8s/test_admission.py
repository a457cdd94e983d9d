"""Admission on the Kubernetes pool: Lab checks the organization's cap and billing, and at
submit that the spec can ever fit the pool (LAB_POOL); order, room and placement are Kueue's."""

from __future__ import annotations

import pytest

from jobs.admission import admission_pass
from jobs.models import Job
from jobs.services import job_submit
from lab.audit import Actor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]

POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 1}, {"gpu_type": "cpu", "gpus": 0, "count": 1}]}


@pytest.fixture
def kubernetes(settings):
    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_POOL = POOL
    settings.LAB_LOCAL_SLOTS = 1
    settings.LAB_ORG_MAX_RUNNING_JOBS = 3


def submit(tenant, spec, **resources) -> Job:
    return job_submit(project=tenant.project, actor=Actor(user=tenant.user), data={**spec, "resources": resources})


def statuses(*jobs: Job) -> list[tuple[str, str]]:
    return [tuple(Job.objects.unscoped().filter(pk=job.pk).values_list("status", "status_reason").get()) for job in jobs]


def test_kueue_owns_room_so_lab_admits_up_to_the_organizations_cap(owner, spec, kubernetes):
    jobs = [submit(owner, spec, gpu_type="H100", gpus=8) for _ in range(4)]  # 32 GPUs asked of an 8-GPU pool

    admission_pass()

    assert statuses(*jobs) == [("starting", "")] * 3 + [("queued", "org_concurrency_limit")]


def test_the_local_pool_still_counts_room(owner, spec, settings):
    settings.LAB_POOL = POOL
    settings.LAB_ORG_MAX_RUNNING_JOBS = 3
    jobs = [submit(owner, spec, gpu_type="H100", gpus=8) for _ in range(2)]

    admission_pass()

    assert statuses(*jobs) == [("starting", ""), ("queued", "pool_full")]


@pytest.mark.parametrize("resources, param, message", [
    ({"gpu_type": "B200", "gpus": 8}, "resources.gpu_type", "the pool has no 'B200' nodes; available: H100, cpu"),
    ({"gpu_type": "H100", "gpus": 16}, "resources.gpus", "16 GPUs do not fit on one 'H100' node (at most 8)"),
])
def test_a_spec_that_can_never_fit_is_a_400_at_submit_and_creates_nothing(owner, spec, kubernetes, resources, param, message):
    response = owner.client().post("/api/v1/jobs", {**spec, "resources": resources}, format="json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    assert [problem["message"] for problem in error["errors"]] == [message]
    assert Job.objects.unscoped().count() == 0
