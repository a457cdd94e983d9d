"""End to end: ``old-double``, a ``load_environment`` package pinning ``verifiers==0.1.9``
(tests/environments/fixtures/old-double), is pushed to a running Lab, built against the local
package index on verifiers 0.1.9 itself, and trains a tiny-model job on its build on the local
launcher, every reward function of its rubric reported."""

from __future__ import annotations

import pytest
from django.db import connection
from labsdk import Lab

from tests.support.environments import build_ended, wait_finished
from tests.support.load_environment_wheels import fixture_wheel
from tests.support.packages import TINY, local_index_url
from tests.support.stack import running_stack

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]



@pytest.fixture
def stack(tmp_path, settings):
    index = local_index_url()
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_PACKAGE_INDEX_URL=index) as lab:
        yield lab


def test_a_package_pinning_verifiers_0_1_9_builds_on_it_and_trains_through_lab(stack, owner, tmp_path):
    filename, data = fixture_wheel("old-double")
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/old-double@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/old-double@0.1.0"
        build = build_ended(url, headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        assert (build["api"], build["verifiers_version"]) == ("v0", "0.1.9")
        job = lab.jobs.create({**TINY, "max_steps": 2, "env": [{"id": "acme/old-double", "args": {"num_examples": 4}}]})
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}
    assert sorted(points) == [1, 2]
    for values in points.values():
        functions = {name: values[f"reward/old-double/{name}/mean"] for name in ("exact", "brief", "num_turns")}
        assert functions["num_turns"] == 1.0, values
        assert values["reward/old-double/mean"] == pytest.approx(functions["exact"] + 0.1 * functions["brief"]), values
