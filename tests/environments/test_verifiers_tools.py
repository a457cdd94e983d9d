"""The engine trains on tool-using verifiers v1 tasksets: each episode is verifiers' own rollout
in the verifiers bridge (the ``null`` harness's chat program, prepared offline, and the task's
MCP tool server, both real processes), its model calls answered by Lab's policy turn by turn,
the tool results masked out of the loss and the reward the task's own ``@vf.reward`` functions."""

from __future__ import annotations

import io
import re
import zipfile

from engine.environments import Example
from engine.environments.verifiers_taskset import BRIDGE_SCRIPT, Bridge, verifiers_python
from engine.models import tiny_random_llama_tokenizer
from engine.multi_turn import run_episodes
from engine.rollout import Completion
from tests.environments.verifiers_wheels import calc_wheel, read_lines, require_verifiers_python, run_in_verifiers
from tests.support.packages import run_engine

ENV_ID = "acme/calc-env@0.1.0"
ANSWER = "The sum is {}."
CALL = '<tool_call>{{"name": "calc_add", "arguments": {{"a": {}, "b": {}}}}}</tool_call>'


class ScriptedBackend:
    """A rollout backend whose replies are scripted, so a turn's output is known: the first
    reply of a conversation calls ``calc_add`` on the prompt's two numbers, the next one states
    their sum; each token's log-probability is -0.5."""

    policy_version = 0

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prompts: list[str] = []

    def generate(self, prompts, **_sampling):
        completions = []
        for ids in prompts:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            self.prompts.append(text)
            a, b = map(int, re.search(r"what is (\d+) \+ (\d+)\?", text).groups())
            reply = ANSWER.format(a + b) if "<|im_start|>tool\n" in text else CALL.format(a, b)
            tokens = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            completions.append(Completion(token_ids=tokens, logprobs=[-0.5] * len(tokens), truncated=False))
        return completions


class BridgeEnvironment:
    """The engine's side of one opened taskset (as engine.environments.verifiers_taskset's
    VerifiersTaskset asks the bridge)."""

    id, limits, retries, timeout = ENV_ID, {"max_turns": 4}, 0, None

    def __init__(self, bridge: Bridge, handle: int):
        self.bridge, self.handle = bridge, handle

    def start_episodes(self, task_ids, limits):
        return self.bridge.request("start", handle=self.handle, task_ids=task_ids, limits=dict(limits))

    def reply(self, answers):
        return self.bridge.request("reply", handle=self.handle, answers=answers)


def test_a_tool_call_the_policy_samples_runs_the_tasks_tool_server_and_its_result_is_masked_out(tmp_path):
    require_verifiers_python()
    _, data = calc_wheel()
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp_path / "site")
    log = tmp_path / "tools.jsonl"
    bridge = Bridge(python=verifiers_python(), site=tmp_path / "site", workdir=tmp_path, package_id=ENV_ID)
    try:
        opened = bridge.request("open", taskset=ENV_ID, args={"num_tasks": 8, "log_path": str(log)})
        assert (opened["multi_turn"], opened["tools"], opened["agents"]) == (True, True, [{"name": "agent"}])
        assert opened["rewards"] == [{"name": "correct", "weight": 1.0}, {"name": "used_tool", "weight": 0.5}]
        (task,) = bridge.request("tasks", handle=opened["handle"], split="train", start=0, n=1, seed=0)["tasks"]
        tokenizer = tiny_random_llama_tokenizer()
        backend = ScriptedBackend(tokenizer)
        (rollout,) = run_episodes(
            BridgeEnvironment(bridge, opened["handle"]), [Example(messages=task["messages"], answer="", info={"task_id": task["id"]})],
            1, tokenizer=tokenizer, backend=backend, stop_token_ids=[tokenizer.eos_token_id], context_length=512,
            max_tokens=128, temperature=1.0, seed=0, template_kwargs={},
        )
    finally:
        bridge.close()

    a, b = map(int, re.search(r"what is (\d+) \+ (\d+)\?", task["messages"][-1]["content"]).groups())
    # The task's own tool server ran, as a process of its own, on the task it fetched, and got the call.
    (started, called) = read_lines(log)
    assert started["event"] == "start" and started["idx"] == task["idx"] and started["pid"] > 0
    assert called == {"event": "add", "a": a, "b": b}
    # The second turn was sampled after the tool's result, which the chat template renders as a tool turn.
    assert len(backend.prompts) == 2
    assert backend.prompts[1].endswith(
        f"<|im_start|>assistant\n{CALL.format(a, b)}<|im_end|>\n<|im_start|>tool\n{a + b}<|im_end|>\n<|im_start|>assistant\n"
    )
    # The task's own reward functions scored verifiers' trace: the sum stated, a tool result in it.
    assert (rollout.reward, rollout.functions, rollout.turns) == (1.5, {"correct": 1.0, "used_tool": 1.0}, 2)
    assert rollout.stop_condition == "agent_completed"
    # Trained on the sampled tokens only: the two replies, with the sampler's log-probabilities;
    # the tool's result and the template around it are masked out.
    completion = rollout.completion
    sampled = [tokenizer.decode(completion.token_ids[i:i + 1], skip_special_tokens=False)
               for i, kept in enumerate(completion.loss_mask) if kept]
    assert "".join(sampled) == f"{CALL.format(a, b)}<|im_end|>{ANSWER.format(a + b)}<|im_end|>"
    assert completion.sampled_logprobs() == [-0.5] * len(sampled)
    masked = tokenizer.decode([token for token, kept in zip(completion.token_ids, completion.loss_mask) if not kept],
                              skip_special_tokens=False)
    assert masked == f"\n<|im_start|>tool\n{a + b}<|im_end|>\n<|im_start|>assistant\n"
    assert rollout.text == f"[assistant]\n{CALL.format(a, b)}\n\n[tool]\n{a + b}\n\n[assistant]\n{ANSWER.format(a + b)}"


def test_a_tiny_model_job_trains_on_a_tool_using_taskset_each_rollout_with_its_own_tool_server(tmp_path):
    """Through the engine, turn by turn: the random tiny model calls no tool, but every rollout
    is verifiers' own (the chat program asked for each turn; the task's tool server started for
    it), scored by the task's reward functions."""
    require_verifiers_python()
    log = tmp_path / "tools.jsonl"
    result = run_engine(tmp_path, ENV_ID, [calc_wheel()], args={"num_tasks": 16, "log_path": str(log)},
                        block={"max_turns": 2}, spec={"max_steps": 1})
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    (point,) = read_lines(work / "metrics.jsonl")
    assert {"reward/calc-env/correct/mean", "reward/calc-env/used_tool/mean", "reward/calc-env/mean"} <= set(point["values"])
    samples = read_lines(work / "samples.jsonl")
    assert len(samples) == 4
    assert all(set(sample["metrics"]) == {"correct", "used_tool"} and sample["completion"].startswith("[assistant]\n")
               for sample in samples)
    # One tool server per rollout, each a process of its own.
    started = [record for record in read_lines(log) if record["event"] == "start"]
    assert len(started) == 4 and len({record["pid"] for record in started}) == 4


WHERE = "in the verifiers environment (its script's dependencies come from there: Lab prepares it offline, without uv)"
_PREPARE = r'''
import sys
sys.path.append(sys.argv[1])
import verifiers_bridge
for dependencies in ('"openai", "mcp==2.0.0"', '"mcp==1.0.0"', '"frobnicator-9000>=1"'):
    script = f'# /// script\n# dependencies = [{dependencies}]\n# ///\nprint("hello")\n'
    try:
        print("prepared", verifiers_bridge.prepare_offline_script(script, what="the program").endswith(".py"))
    except verifiers_bridge.BridgeError as error:
        print(error.code, error)
'''


def test_a_harness_script_is_prepared_offline_only_when_what_it_declares_is_installed(tmp_path):
    require_verifiers_python()
    result = run_in_verifiers(_PREPARE, str(BRIDGE_SCRIPT.parent), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "prepared True",
        f"unsupported the program needs mcp==1.0.0, and 2.0.0 is installed {WHERE}",
        f"unsupported the program needs frobnicator-9000>=1, and it is not installed {WHERE}",
    ]


def test_an_episodes_long_error_keeps_its_head_and_its_cause_and_the_log_keeps_it_whole(capsys):
    """verifiers' tool-server errors end with the server log's tail, where a traceback's cause is."""
    from engine.environments.verifiers_bridge import ERROR_HEAD, ERROR_TAIL, _error_text

    text = ("ToolsetError: server did not report its port: Traceback (most recent call last):\n"
            + "  File \"runpy\", line 198\n" * 200 + "ModuleNotFoundError: No module named 'frobnicator_9000'")
    line = _error_text(text, "e7")

    assert line.startswith("ToolsetError: server did not report its port")
    assert line.endswith("ModuleNotFoundError: No module named 'frobnicator_9000'")
    assert len(line) == ERROR_HEAD + len(" ... ") + ERROR_TAIL and "\n" not in line
    assert capsys.readouterr().err == f"episode e7 failed: {text}\n"
    assert _error_text("ValueError: short", "e8") == "ValueError: short"
