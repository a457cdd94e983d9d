"""End to end: a wheel pushed through the SDK trains a tiny-model job on the real stack (uvicorn,
Celery worker, local launcher, engine subprocess); a package with a missing dependency fails the
job with environment_error naming the module."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection
from labsdk import Lab

from jobs.models import Job
from tests.support.environments import build_ended, wait_finished
from tests.support.packages import TINY
from tests.support.stack import running_stack
from tests.support.wheelbuilder import lab_wheel

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]


@pytest.fixture
def stack(tmp_path, settings):
    # Wheels on S3 (signed URL fetch, sweep, delete) are tests/environments/test_environments_s3.py's part.
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1") as lab:
        yield lab


def test_a_pushed_environment_trains_a_tiny_job_and_a_missing_dependency_fails_it(stack, owner, tmp_path):
    good = tmp_path / lab_wheel("echo-env", "0.1.0")[0]
    good.write_bytes(lab_wheel("echo-env", "0.1.0")[1])
    needy_name, needy_bytes = lab_wheel("needy-env", "1.0", extra_requires=("frobnicator_9000",))
    needy = tmp_path / needy_name
    needy.write_bytes(needy_bytes)
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(good).id == "acme/echo-env@0.1.0"
        assert lab.environments.push(needy).id == "acme/needy-env@1.0"
        job = lab.jobs.create({**TINY, "env": [{"id": "acme/echo-env", "args": {"digits": 2}}]})
        assert job.spec["env"][0]["id"] == "acme/echo-env@0.1.0"
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        names = set().union(*(point.values for point in lab.jobs.metrics(job.id)))
        assert {"reward/echo-env/mean", "reward/echo-env/exact/mean", "reward/echo-env/starts/mean"} <= names

        # Its build cannot resolve frobnicator_9000 (no index has it): a job naming it is refused at submit.
        headers = {"Authorization": f"Bearer {owner.key}"}
        url = f"{stack.base_url}/api/v1/environments/acme/needy-env@1.0"
        build = build_ended(url, headers, timeout=120)
        assert build["status"] == "failed" and "frobnicator" in build["error"], build
        refused = httpx.post(f"{stack.base_url}/api/v1/jobs", headers=headers, json={**TINY, "env": [{"id": "acme/needy-env@1.0"}]})
        assert refused.status_code == 400 and "did not build" in refused.json()["error"]["message"], refused.text
        assert not Job.objects.unscoped().filter(spec__env__0__id="acme/needy-env@1.0").exists()
