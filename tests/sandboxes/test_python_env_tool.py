"""verifiers' ``PythonEnv`` (``tests/environments/fixtures/python-repl``, its build's verifiers 0.3.0
and prime-sandboxes 0.2.36) in the ``load_environment`` bridge, its episodes driven turn by turn
as the engine drives them, its ``prime-sandboxes`` client pointed at a live Lab with an API key:
a ``python`` tool call the policy samples runs in the worker its sandbox's start command started,
and its output comes back as the tool turn."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from engine.environments import Example
from engine.environments.verifiers_taskset import start_load_environment_bridge
from engine.models import tiny_random_llama_tokenizer
from engine.multi_turn import run_episodes
from sandboxes.models import Sandbox, SandboxStatus
from tests.support.packages import build_fixture, install_build
from tests.support.scripted import BridgeEnvironment, ScriptedBackend

pytestmark = [pytest.mark.django_db(transaction=True)]

REPL = "acme/python-repl@0.1.0"
TOOL_TURN = "\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``python-repl``'s build against the local package index, installed."""
    built = build_fixture(tmp_path_factory.mktemp("python-env-tool"), "python-repl")
    site = built["root"] / "site"
    zipfile.ZipFile(io.BytesIO(built["data"])).extractall(site)
    return {**built, "python": install_build(built, REPL), "site": site}


def test_a_python_tool_call_of_the_policy_runs_in_the_worker_its_sandboxs_start_command_started(
    built, live_server, owner, tmp_path
):
    assert {item["name"]: item["version"] for item in built["lock"]}["verifiers"] == "0.3.0"
    prime = {"PRIME_API_BASE_URL": f"{live_server.url}/prime", "PRIME_API_KEY": owner.key}
    bridge = start_load_environment_bridge(package_id=REPL, python=built["python"], site=built["site"], workdir=tmp_path,
                                           secret_names=tuple(prime), environ=prime)
    call = '<tool_call>{}</tool_call>'.format(json.dumps({"name": "python", "arguments": {"code": "y = 6 * 7\nprint(y * 2)"}}))
    try:
        opened = bridge.request("open", taskset=REPL, args={"num_examples": 1, "max_turns": 3})
        (task,) = bridge.request("tasks", handle=opened["handle"], split="train", start=0, n=1, seed=0)["tasks"]
        tokenizer = tiny_random_llama_tokenizer()
        backend = ScriptedBackend(tokenizer, lambda prompt: call if "<|im_start|>tool" not in prompt else "y - 42")
        (rollout,) = run_episodes(
            BridgeEnvironment(bridge, opened["handle"], REPL, {"max_turns": None}),
            [Example(messages=task["messages"], answer="", info={"task_id": task["id"]})], 1,
            tokenizer=tokenizer, backend=backend, stop_token_ids=[tokenizer.eos_token_id], context_length=2048,
            max_tokens=128, temperature=1.0, seed=0, template_kwargs={},
        )
    finally:
        bridge.close()
    assert (opened["multi_turn"], opened["tools"]) == (True, True)
    # The worker's answer to the policy's cell came back as the tool turn.
    assert backend.prompts[1].endswith(f"{call}<|im_end|>{TOOL_TURN.format(84)}"), backend.prompts[1][-300:]
    # Then post_rollout's cells ran in the same worker: the reply "y - 42" read the policy's y (task 0: 0 * 7).
    assert (rollout.functions["python_calls"], rollout.functions["worker"], rollout.functions["correct"]) == (1.0, 1.0, 1.0)
    assert (rollout.turns, rollout.stop_condition) == (2, "no_tools_called")
    made = list(Sandbox.objects.unscoped().filter(project=owner.project))
    assert [(sandbox.labels, sandbox.status) for sandbox in made] == [({"env": "python-repl"}, SandboxStatus.STOPPED)]
