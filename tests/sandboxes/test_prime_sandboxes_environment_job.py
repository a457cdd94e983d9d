"""End to end: a ``load_environment`` package that runs each reply in a sandbox through Prime's own
``prime-sandboxes`` client (``tests/environments/fixtures/sandbox-run``, as its build resolves it
from the local package index) trains a tiny-model job on a running Lab (web, a Celery worker
with beat, the local launcher with the engine in its own sandbox, the session's sandbox agent).
The engine gives the environment ``PRIME_API_BASE_URL`` at Lab's ``/prime`` and the attempt's
sandbox key: its sandbox is the attempt's (labels, ``job_id``, audit row), every reply ran in it,
and the sandbox the environment never deletes is stopped once the attempt ends. verifiers' own
``vf.SandboxEnv`` (``bash-sandbox``) and ``vf.PythonEnv`` (``python-repl``: its sandbox's start
command runs verifiers' Python worker) train the same way. So does a verifiers v1 taskset whose
reward functions take a runtime (``runtime-code``): the bridge scores each rollout in a box of
verifiers' own ``prime`` runtime, a sandbox of the attempt that verifiers deletes once scored."""

from __future__ import annotations

from pathlib import Path

import pytest
from labsdk import Lab

from engine.environments.verifiers_taskset import verifiers_python
from lab.models import AuditLogEntry
from sandboxes.models import Sandbox, SandboxStatus
from tests.support.environments import build_ended, wait_finished
from tests.support.packages import TINY, local_index_url
from tests.support.stack import STACK_TEST_MARKS, running_stack
from tests.support.wheelbuilder import folder_wheel

pytestmark = STACK_TEST_MARKS

FIXTURES = Path(__file__).resolve().parents[1] / "environments" / "fixtures"


@pytest.fixture
def stack(tmp_path, settings, agent):
    with running_stack(
        tmp_path / "lab",
        settings,
        LAB_ENGINE_THREADS="1",
        LAB_PACKAGE_INDEX_URL=local_index_url(),
        LAB_SANDBOX_AGENT_URL=agent.url,
        LAB_SANDBOX_DATA_PLANE_URL=agent.url,
        LAB_SANDBOX_AGENT_SECRET=agent.secret,
    ) as lab:
        yield lab


def test_an_environment_runs_its_replies_in_sandboxes_of_its_attempt_through_prime_sandboxes(
    stack, owner, tmp_path, runtime
):
    filename, data = folder_wheel(FIXTURES / "sandbox-run")
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == "acme/sandbox-run@0.1.0"
        url = f"{stack.base_url}/api/v1/environments/acme/sandbox-run@0.1.0"
        build = build_ended(url, headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        spec = {**TINY, "max_steps": 2, "env": [{"id": "acme/sandbox-run", "args": {"num_examples": 4}}]}
        job = lab.jobs.create(spec)
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        points = {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}

    assert {step: values["reward/sandbox-run/ran/mean"] for step, values in points.items()} == {1: 1.0, 2: 1.0}
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job.id))
    assert len(made) == 1, made  # one for the bridge's process, as the environment makes it
    sandbox = made[0]
    assert (sandbox.attempt.number, sandbox.project_id, sandbox.image) == (1, owner.project.pk, "python:3.11")
    assert sandbox.labels == {"env": "sandbox-run", "lab.job": job.id, "lab.attempt": "1"}
    assert AuditLogEntry.objects.filter(action="sandbox.create", target=sandbox.public_id, data__job=job.id).exists()
    # The environment never deletes it: Lab stopped it when the attempt ended, and the agent holds it no more.
    assert sandbox.status == SandboxStatus.STOPPED
    assert sandbox.public_id not in runtime.held()[1]
    deleted = AuditLogEntry.objects.filter(action="sandbox.delete", target=sandbox.public_id)
    assert list(deleted.values_list("actor_user", "actor_api_key")) == [(None, None)]  # by Lab itself


def _build_and_train(stack, owner, tmp_path, name: str, args: dict) -> tuple[dict, str, dict]:
    """Push the fixture package ``name``, wait for its build (ready) and train one step on it;
    return the build, the succeeded job's id and its metrics by step."""
    filename, data = folder_wheel(FIXTURES / name)
    (tmp_path / filename).write_bytes(data)
    headers = {"Authorization": f"Bearer {owner.key}"}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        assert lab.environments.push(tmp_path / filename).id == f"acme/{name}@0.1.0"
        build = build_ended(f"{stack.base_url}/api/v1/environments/acme/{name}@0.1.0", headers)
        assert build["status"] == "ready", f"{build}\n{stack.logs()}"
        job = lab.jobs.create({**TINY, "max_steps": 1, "env": [{"id": f"acme/{name}", "args": args}]})
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        return build, job.id, {point.step: point.values for point in lab.jobs.metrics(job.id, limit=100)}


def _deleted_by_verifiers_through_the_attempts_key(made: list, owner, runtime) -> bool:
    """Whether every sandbox of ``made`` is gone from its agent, deleted by verifiers through the
    attempt's key (acting as the job's creator: its API key), not left to Lab."""
    ids = {sandbox.public_id for sandbox in made}
    deletes = AuditLogEntry.objects.filter(action="sandbox.delete", target__in=ids)
    return not ids & runtime.held()[1] and sorted(deletes.values_list("target", "actor_api_key")) == sorted(
        (sandbox_id, owner.api_key.pk) for sandbox_id in ids
    )


def test_a_sandbox_env_runs_its_bash_tool_in_sandboxes_of_its_attempt_and_deletes_each(stack, owner, tmp_path, runtime):
    # verifiers 0.3.1's SandboxEnv (start_command=None: bash_sandbox.py says why) with the prime-sandboxes the build
    # resolves as of its push; a sandbox per rollout, made in setup_state, the reply run in it in post_rollout, deleted
    # by verifiers.
    build, job_id, points = _build_and_train(stack, owner, tmp_path, "bash-sandbox", {"num_examples": 4, "max_turns": 2})
    locked = {item["name"]: item["version"] for item in build["lock"]}
    assert (locked["verifiers"], locked["prime-sandboxes"]) == ("0.3.1", "0.5.1"), locked

    assert points[1]["reward/bash-sandbox/ran/mean"] == 1.0, points
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id))
    assert len(made) == TINY["batch_size"], made  # one per rollout
    assert {sandbox.attempt.number for sandbox in made} == {1}
    assert all(sandbox.labels == {"env": "bash-sandbox", "lab.job": job_id, "lab.attempt": "1"} for sandbox in made)
    assert {sandbox.status for sandbox in made} == {SandboxStatus.STOPPED}
    assert _deleted_by_verifiers_through_the_attempts_key(made, owner, runtime)


def test_a_python_env_runs_its_python_worker_in_sandboxes_of_its_attempt_and_deletes_each(stack, owner, tmp_path, runtime):
    # verifiers' own PythonEnv (tests/environments/fixtures/python-repl): each rollout's sandbox is created with
    # PythonEnv's start command, which starts verifiers' Python worker (FIFOs in /tmp, a ready flag); the cells
    # post_rollout sends reach that worker through execute_command, and verifiers deletes the sandbox.
    build, job_id, points = _build_and_train(stack, owner, tmp_path, "python-repl", {"num_examples": 4, "max_turns": 2})
    locked = {item["name"]: item["version"] for item in build["lock"]}
    # The only verifiers whose PythonEnv loads: its string start command needs prime-sandboxes <= 0.2.36.
    assert (locked["verifiers"], locked["prime-sandboxes"]) == ("0.3.0", "0.2.36"), locked
    assert (build["environment_class"], build["multi_turn"]) == ("python_repl.PythonReplEnv", True)

    # Every rollout's worker ran both cells and kept its variable between them (Python 3.11: the sandbox's).
    assert points[1]["reward/python-repl/worker/mean"] == 1.0, points
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id))
    assert len(made) == TINY["batch_size"], made  # one per rollout
    assert all(sandbox.labels == {"env": "python-repl", "lab.job": job_id, "lab.attempt": "1"} for sandbox in made)
    assert {(sandbox.image, sandbox.status) for sandbox in made} == {("python:3.11", SandboxStatus.STOPPED)}
    assert _deleted_by_verifiers_through_the_attempts_key(made, owner, runtime)


def test_a_taskset_whose_rewards_take_a_runtime_trains_with_each_rollout_scored_in_a_sandbox_of_its_attempt(
    stack, owner, tmp_path, runtime
):
    # tests/environments/fixtures/runtime-code: a single-turn v1 taskset whose reply is a Python program; prints_sum
    # runs it in the reward's runtime, box_runs runs Python there whatever the reply, short reads the trace alone.
    if not verifiers_python().exists():
        pytest.fail(f"{verifiers_python()} does not exist: run `make install` (it creates .venv-verifiers)")
    _, job_id, points = _build_and_train(stack, owner, tmp_path, "runtime-code", {"num_tasks": 16})

    values = points[1]
    # Every reward function is reported; the box ran Python in /workspace for every rollout.
    assert {"reward/runtime-code/mean", "reward/runtime-code/prints_sum/mean", "reward/runtime-code/box_runs/mean",
            "reward/runtime-code/short/mean"} <= set(values), values
    assert values["reward/runtime-code/box_runs/mean"] == 1.0, values
    # The rollout's reward is verifiers' weighted sum: prints_sum x 1 (the others weigh 0).
    assert abs(values["reward/runtime-code/mean"] - values["reward/runtime-code/prints_sum/mean"]) < 1e-9
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id))
    assert len(made) == TINY["batch_size"], made  # one per rollout, as verifiers' own rollout makes it
    assert {(sandbox.attempt.number, sandbox.image, sandbox.status) for sandbox in made} == {(1, "python:3.11", SandboxStatus.STOPPED)}
    assert all((sandbox.labels["lab.job"], sandbox.labels["lab.attempt"]) == (job_id, "1") for sandbox in made)
    # None outlives the attempt: verifiers deleted each, through the attempt's key, once it was scored.
    assert _deleted_by_verifiers_through_the_attempts_key(made, owner, runtime)
