"""End to end: a verifiers v1 taskset wheel pushed with the CLI (`lab envs push`) trains a
tiny-model job on the real stack (uvicorn, Celery worker, local launcher, engine subprocess and
its verifiers bridge), with one metric per reward function; a verifiers package importing a module
no index has fails its build, and a job naming it is refused at submit."""

from __future__ import annotations

import httpx
import pytest
from django.db import connection
from labsdk import Lab
from labsdk.cli import main

from jobs.models import Job
from tests.environments.verifiers_wheels import require_verifiers_python, spell_wheel
from tests.support.environments import build_ended, wait_finished
from tests.support.packages import TINY
from tests.support.stack import running_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1") as lab:
        yield lab


def test_a_verifiers_taskset_pushed_with_the_cli_trains_a_tiny_job_and_one_whose_build_failed_is_refused(
    stack, owner, tmp_path, monkeypatch, capsys
):
    require_verifiers_python()
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", stack.base_url)
    paths = []
    for filename, data in (spell_wheel(), spell_wheel("needy-spell", "1.0", prelude="import frobnicator_9000")):
        paths.append(tmp_path / filename)
        paths[-1].write_bytes(data)
    assert main(["envs", "push", str(paths[0])]) == 0
    assert capsys.readouterr().out == "acme/spell-env@0.1.0\n"
    assert main(["envs", "push", str(paths[1])]) == 0
    assert capsys.readouterr().out == "acme/needy-spell@1.0\n"

    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.retrieve("acme/spell-env").kind == "verifiers"
        job = lab.jobs.create({**TINY, "env": [{"id": "acme/spell-env", "args": {"num_tasks": 32, "max_length": 4}}]})
        assert job.spec["env"][0]["id"] == "acme/spell-env@0.1.0"
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = list(lab.jobs.metrics(job.id))
        assert [point.step for point in points] == [1, 2]
        names = set().union(*(point.values for point in points))
        assert {"reward/spell-env/mean", "reward/spell-env/exact/mean", "reward/spell-env/letters/mean",
                "reward/spell-env/short/mean"} <= names

    # Its build fails importing the module (frobnicator_9000 is on no index): a job naming it is refused at submit.
    headers = {"Authorization": f"Bearer {owner.key}"}
    url = f"{stack.base_url}/api/v1/environments/acme/needy-spell@1.0"
    build = build_ended(url, headers)
    assert build["status"] == "failed" and "needs the module 'frobnicator_9000'" in build["error"], build
    refused = httpx.post(f"{stack.base_url}/api/v1/jobs", headers=headers, json={**TINY, "env": [{"id": "acme/needy-spell@1.0"}]})
    assert refused.status_code == 400 and "did not build" in refused.json()["error"]["message"], refused.text
    assert not Job.objects.unscoped().filter(spec__env__0__id="acme/needy-spell@1.0").exists()
