"""The verifiers bridge scores a v1 taskset's reward functions that take a runtime in a box of
verifiers' own ``prime`` runtime on a live Lab, with an attempt's sandbox key as the engine hands
it over (the ``sandboxes`` request): one sandbox of the attempt per rollout, with every reward
function scored, and deleted once scored, also when scoring runs past its timeout
(``tests/environments/fixtures/runtime-code``; docs/environments.md "Reward functions that take a
runtime")."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from engine.environments.verifiers_taskset import Bridge, verifiers_python
from sandboxes.models import Sandbox, SandboxStatus
from tests.support.job_sandboxes import attempt_sandbox_key, held, launched_attempt, stop_active_sandboxes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime", "no_broker")]

FIXTURE = Path(__file__).resolve().parents[1] / "environments" / "fixtures" / "runtime-code" / "runtime_code.py"
TASKSET, SLOW_TASKSET = "acme/runtime-code@0.1.0", "acme/slow-runtime-code@0.1.0"


@pytest.fixture(autouse=True)
def _stop_what_the_test_left(runtime):
    yield
    stop_active_sandboxes(runtime)


def _sandboxes_made(attempt) -> list[Sandbox]:
    """The attempt's sandboxes once every one is stopped (a deletion's row changes after its answer)."""
    deadline = time.monotonic() + 10
    while True:
        made = list(Sandbox.objects.unscoped().filter(attempt=attempt))
        if all(sandbox.status == SandboxStatus.STOPPED for sandbox in made) or time.monotonic() > deadline:
            return made
        time.sleep(0.2)


def test_the_bridge_scores_every_reward_function_with_one_sandbox_of_the_attempt_per_rollout_deleted_once_scored(
    owner, spec, live_server, tmp_path, runtime
):
    if not verifiers_python().exists():
        pytest.fail(f"{verifiers_python()} does not exist: run `make install` (it creates .venv-verifiers)")
    attempt, engine = launched_attempt(owner, spec)
    key = attempt_sandbox_key(attempt, engine)
    (tmp_path / "site").mkdir()
    shutil.copy(FIXTURE, tmp_path / "site" / FIXTURE.name)
    source = FIXTURE.read_text()
    slow = source.replace("import random\n", "import asyncio\nimport random\n").replace(
        '        return 1.0 if (result.exit_code, result.stdout) == (0, "42 /workspace\\n") else 0.0\n',
        '        await asyncio.sleep(60)\n        return 1.0\n',
    )
    assert slow.count("asyncio") == 2, "the fixture's box_runs changed"
    (tmp_path / "site" / "slow_runtime_code.py").write_text(slow)
    bridge = Bridge(python=verifiers_python(), site=tmp_path / "site", workdir=tmp_path, package_id=TASKSET)
    try:
        opened = bridge.request("open", taskset=TASKSET, args={"num_tasks": 4})
        assert opened["runtime_rewards"] == ["box_runs", "prints_sum"]
        assert [reward["name"] for reward in opened["rewards"]] == ["box_runs", "prints_sum", "short"]
        handle = opened["handle"]
        (task,) = bridge.request("tasks", handle=handle, split="train", start=0, n=1, seed=0)["tasks"]
        numbers = [int(number) for number in re.findall(r"\d+", task["messages"][-1]["content"])]
        program = f"```python\nprint({' + '.join(map(str, numbers))})\n```"

        bridge.request("sandboxes", environment={"PRIME_API_BASE_URL": f"{live_server.url}/prime", "PRIME_API_KEY": key["api_key"]})
        scored = bridge.request("score", handle=handle, task_id=task["id"], completion=program, timeout_s=120)
        assert scored == {"reward": 1.0, "functions": {"box_runs": 1.0, "prints_sum": 1.0, "short": 1.0},
                          "weights": {"box_runs": 0.0, "prints_sum": 1.0, "short": 0.0}}
        wrong = bridge.request("score", handle=handle, task_id=task["id"], completion="print(0)", timeout_s=120)
        assert wrong["functions"] == {"box_runs": 1.0, "prints_sum": 0.0, "short": 1.0}
        # A reward still running in its box past the timeout: scoring is cancelled, the box deleted all the same.
        slow = bridge.request("open", taskset=SLOW_TASKSET, args={"num_tasks": 4})["handle"]
        (task,) = bridge.request("tasks", handle=slow, split="train", start=0, n=1, seed=0)["tasks"]
        late = bridge.request("score", handle=slow, task_id=task["id"], completion=program, timeout_s=3)
        assert late == {"timeout": True, "message": f"taskset {SLOW_TASKSET}: scoring took longer than its 3s timeout"}
    finally:
        bridge.close()

    made = _sandboxes_made(attempt)
    assert len(made) == 3, made  # one per scoring
    assert {(sandbox.image, sandbox.status) for sandbox in made} == {("python:3.11", SandboxStatus.STOPPED)}
    assert all((sandbox.labels["lab.job"], sandbox.labels["lab.attempt"]) == (attempt.job.public_id, "1") for sandbox in made)
    assert not {sandbox.public_id for sandbox in made} & held(runtime)
