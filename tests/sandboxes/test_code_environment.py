"""`lab/python-code` scored in real sandboxes of the session's agent (engine/environments/python_code.py):
a right program scores 1, a wrong one 0, a half-right one 0.5, and one that hangs or forges its
output scores nothing; the program never runs in the test's process."""

from __future__ import annotations

import json
import random
import time
import uuid

import pytest

from engine import sandboxes
from engine.environments import EnvironmentFailed, Example, load_environment
from engine.environments.python_code import TASKS, program_of
from sandboxes.runtime.base import SandboxSpec


class AgentSandboxes:
    """A provider of sandboxes straight from the agent (what Lab's ingest API hands the engine)."""

    def __init__(self, runtime, agent):
        self.runtime, self.agent, self.specs, self.made = runtime, agent, {}, []

    def create(self, **fields) -> sandboxes.Sandbox:
        spec = SandboxSpec(
            sandbox_id=f"sbx_code{uuid.uuid4().hex[:12]}", image=fields["image"], cpu_cores=fields["cpu_cores"],
            memory_gb=fields["memory_gb"], disk_gb=fields["disk_gb"], expires_at=time.time() + 600,
        )
        self.runtime.start(spec)
        self.specs[spec.sandbox_id] = spec
        self.made.append(spec.sandbox_id)
        token = self.runtime.token(spec.sandbox_id, expires_at=time.time() + 600)
        return sandboxes.Sandbox(spec.sandbox_id, self.agent.url, token)

    def delete(self, sandbox: sandboxes.Sandbox) -> None:
        self.runtime.destroy(self.specs.pop(sandbox.id))

    def close(self) -> int:
        for spec in list(self.specs.values()):
            self.runtime.destroy(spec)
        return len(self.specs)


@pytest.fixture
def provider(runtime, agent):
    made = AgentSandboxes(runtime, agent)
    sandboxes.use(made)
    yield made
    sandboxes.close()


SQUARES = Example(
    messages=[{"role": "user", "content": "Write square(x)."}],
    answer=json.dumps([4, 9, 16, 0]),
    info={"function": "square", "calls": [[2], [3], [-4], [0]]},
)


def _score(environment, reply: str):
    return environment.score(reply, SQUARES).functions


def test_it_scores_a_right_program_1_and_a_wrong_one_0_in_one_sandbox(provider, runtime):
    environment = load_environment("lab/python-code", {"timeout_s": 5.0})
    assert _score(environment, "```python\ndef square(x):\n    return x * x\n```") == {"passed": 1.0, "all_passed": 1.0}
    assert _score(environment, "def square(x):\n    return x - 100\n") == {"passed": 0.0, "all_passed": 0.0}
    assert _score(environment, "def square(x):\n    return x + x\n") == {"passed": 0.5, "all_passed": 0.0}  # 2 and 0
    assert _score(environment, "this is no python") == {"passed": 0.0, "all_passed": 0.0}
    assert environment.score("def square(x): return x * x", SQUARES).reward == 1.0
    # What no environment variable can hold is left out rather than failing the job.
    assert _score(environment, "def square(x):\x00 return x * x  # \ud800") == {"passed": 1.0, "all_passed": 1.0}
    assert len(provider.made) == 1  # one sandbox for every reply of the attempt
    assert provider.made[0] in runtime.held()[1]


def test_a_program_that_hangs_or_forges_its_output_passes_nothing(provider):
    environment = load_environment("lab/python-code", {"timeout_s": 1.0})
    started = time.monotonic()
    assert _score(environment, "def square(x):\n    while True:\n        pass\n") == {"passed": 0.0, "all_passed": 0.0}
    assert time.monotonic() - started < 15
    forged = 'print("[{\\"value\\": 4}, {\\"value\\": 9}, {\\"value\\": 16}, {\\"value\\": 0}]")\nimport os\nos._exit(0)\n'
    assert _score(environment, forged) == {"passed": 0.0, "all_passed": 0.0}
    # True is no 4: results compare as JSON.
    assert _score(environment, "def square(x):\n    return 1 == 1\n") == {"passed": 0.0, "all_passed": 0.0}


def test_the_program_runs_in_the_sandbox_not_in_the_engine(provider, tmp_path):
    marker = tmp_path / "ran"
    environment = load_environment("lab/python-code", {"timeout_s": 5.0})
    reply = f"open({str(marker)!r}, 'w').write('x')\ndef square(x):\n    return x * x\n"
    # The host's folder is not in the sandbox: opening it fails, so the program defines nothing.
    assert _score(environment, reply) == {"passed": 0.0, "all_passed": 0.0}
    assert not marker.exists()


def test_a_sandbox_that_is_gone_is_replaced_once(provider):
    environment = load_environment("lab/python-code", {"timeout_s": 5.0})
    assert _score(environment, "def square(x): return x * x")["passed"] == 1.0
    provider.delete(environment._sandbox)
    assert _score(environment, "def square(x): return x * x")["passed"] == 1.0
    assert len(provider.made) == 2 and list(provider.specs) == provider.made[1:]


def test_without_lab_scoring_fails_as_the_environments_failure():
    sandboxes.use(None)
    environment = load_environment("lab/python-code")
    with pytest.raises(EnvironmentFailed, match="without Lab"):
        environment.score("def square(x): return x * x", SQUARES)


def test_every_task_has_a_right_reference_for_its_examples():
    environment = load_environment("lab/python-code", seed=3)
    rng = random.Random(0)
    names = set()
    for _ in range(60):
        example = environment.make_example(rng)
        names.add(example.info["function"])
        assert len(example.info["calls"]) == 4
        assert f"{example.info['function']}(" in example.messages[1]["content"]
    assert names == {task.name for task in TASKS}
    assert program_of("Here:\n```python\ndef f():\n    return 1\n```\nDone.") == "def f():\n    return 1"
