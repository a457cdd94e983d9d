"""The split orchestrator role gets its attempt's sandboxes: a job on `lab/python-code` run with
the engine as three roles (`LAB_ENGINE_ROLES=process`: the orchestrator role runs the environments
and holds no job token) scores its rollouts in sandboxes of its attempt, made with the attempt's
sandbox key the trainer hands it, and none outlives the attempt."""

from __future__ import annotations

import pytest

from jobs.models import MetricStep
from sandboxes.models import Sandbox, SandboxStatus
from tests.support.job_sandboxes import code_spec, held
from tests.support.live import TERMINAL, Api
from tests.support.stack import STACK_TEST_MARKS, LabStack

pytestmark = STACK_TEST_MARKS


@pytest.fixture(scope="module")
def roles_stack(tmp_path_factory, django_db_setup, agent) -> LabStack:
    lab = LabStack(
        tmp_path_factory.mktemp("roles") / "lab", LAB_ENGINE_THREADS="1", LAB_ENGINE_ROLES="process",
        LAB_SANDBOX_AGENT_URL=agent.url, LAB_SANDBOX_DATA_PLANE_URL=agent.url, LAB_SANDBOX_AGENT_SECRET=agent.secret,
    )
    try:
        yield lab.start()
    finally:
        lab.stop()


def test_the_orchestrator_role_scores_the_code_environment_in_sandboxes_of_its_attempt(owner, spec, roles_stack, runtime, settings):
    settings.LAB_DATA_DIR = roles_stack.data_dir
    api = Api(roles_stack, owner.key)
    job_id = api.create(code_spec(spec))["id"]
    done = api.wait_status(job_id, TERMINAL, timeout=300)
    assert done["status"] == "succeeded", (done, roles_stack.logs())
    logs = api.client.get(f"/jobs/{job_id}/logs", params={"limit": 1000}).json()["data"]
    assert any("roles: inference at" in line["line"] for line in logs), "the engine ran as one process"
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id))
    assert made, "the orchestrator role scored no rollout in a sandbox"
    assert {sandbox.attempt.number for sandbox in made} == {1}
    assert all(sandbox.labels == {"lab.job": job_id, "lab.attempt": "1"} for sandbox in made)
    assert {sandbox.status for sandbox in made} == {SandboxStatus.STOPPED}
    assert not {sandbox.public_id for sandbox in made} & held(runtime)
    values = MetricStep.objects.get(job__public_id=job_id, step=2).values
    # Scored by running the programs: without sandboxes every rollout is the environment's failure.
    assert 0.0 <= values["reward/python-code/passed/mean"] <= 1.0
