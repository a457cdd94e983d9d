"""Multi-turn, tool and stateful-tool ``load_environment`` environments train on their build: each
episode is verifiers' own rollout (0.3.1's v0 API) in the ``load_environment`` bridge, run with the
build's Python, its model calls answered by Lab's policy turn by turn, the environment's turns
(hints, tool results) masked out of the loss and the reward its rubric's.

The packages are ``tests/environments/fixtures`` (written as Hub environments are); they share one
build's lock (``verifiers>=0.1.8`` and ``datasets``), built once here against the local package
index (``make package-index``)."""

from __future__ import annotations

import io
import json
import random
import re
import zipfile
from pathlib import Path

import pytest

from engine import build_envs
from engine.environments import Example
from engine.environments.verifiers_taskset import BridgeRefused, start_load_environment_bridge
from engine.models import tiny_random_llama_tokenizer
from engine.multi_turn import run_episodes
from tests.support.load_environment_wheels import fixture_wheel
from tests.support.packages import build_fixture, install_build, run_engine
from tests.support.scripted import BridgeEnvironment, ScriptedBackend

GUESS, TOOLS, VAULT = "acme/number-guess@0.1.0", "acme/tool-arithmetic@0.1.0", "acme/vault-lookup@0.1.0"
MIXTURE = "acme/word-mixture@0.1.0"
HINT = "\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
TOOL_TURN = "\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n"


def _call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


# Environments Lab refuses or whose code fails, beside the fixtures in the bridge's site folder.
OWN_LOOP_ENV = '''
import verifiers as vf
from datasets import Dataset


class OwnLoop(vf.Environment):
    async def rollout(self, input, client, model, sampling_args=None):
        raise NotImplementedError


def load_environment(**kwargs):
    return OwnLoop(dataset=Dataset.from_list([{"question": "Say hi.", "answer": "hi"}]), rubric=vf.Rubric(funcs=[]))
'''
# Named as verifiers' own CLI agents' environment, which is refused; a SandboxEnv and a PythonEnv run
# (tests/sandboxes/test_prime_sandboxes_environment_job.py).
SANDBOXED_GAME = '''
import verifiers as vf
from datasets import Dataset


class SandboxEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "ran in a sandbox"}]


class CliAgentEnv(SandboxEnv):
    pass


def load_environment(**kwargs):
    return CliAgentEnv(dataset=Dataset.from_list([{"question": "Run it.", "answer": "x"}]), rubric=vf.Rubric(funcs=[]))
'''
CRASHING_GAME = '''
import verifiers as vf
from datasets import Dataset


class CrashingGame(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise RuntimeError("the referee fell over")


def load_environment(**kwargs):
    rows = Dataset.from_list([{"question": "Play.", "answer": "x"}])
    return CrashingGame(dataset=rows, rubric=vf.Rubric(funcs=[lambda completion, **k: 1.0]), max_turns=3)
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixtures' build (built once, from ``word-mixture``: its probe and smoke rollout play an
    EnvGroup's episodes) and its environment installed."""
    built = build_fixture(tmp_path_factory.mktemp("load-environment-multi-turn"), "word-mixture")
    return {**built, "python": install_build(built, MIXTURE)}


@pytest.fixture(scope="module")
def bridge(built):
    """One ``load_environment`` bridge over a site folder holding every fixture package."""
    root = built["root"]
    site = root / "site"
    for name in ("number-guess", "tool-arithmetic", "vault-lookup", "word-mixture"):
        zipfile.ZipFile(io.BytesIO(fixture_wheel(name)[1])).extractall(site)
    (site / "own_loop.py").write_text(OWN_LOOP_ENV)
    (site / "crashing_game.py").write_text(CRASHING_GAME)
    (site / "sandboxed_game.py").write_text(SANDBOXED_GAME)
    bridge = start_load_environment_bridge(package_id=GUESS, python=built["python"], site=site, workdir=root)
    yield bridge
    bridge.close()


def _episodes(bridge, env_id: str, args: dict, reply, *, n_tasks: int = 1, limits: dict | None = None):
    """Open ``env_id`` and run one episode of each of its first ``n_tasks`` train tasks through the
    engine's multi-turn loop, the policy's replies given by ``reply(rendered prompt)``."""
    opened = bridge.request("open", taskset=env_id, args=args)
    tasks = bridge.request("tasks", handle=opened["handle"], split="train", start=0, n=n_tasks, seed=0)["tasks"]
    tokenizer = tiny_random_llama_tokenizer()
    backend = ScriptedBackend(tokenizer, reply)
    rollouts = run_episodes(
        BridgeEnvironment(bridge, opened["handle"], env_id, {"max_turns": None, **(limits or {})}),
        [Example(messages=task["messages"], answer="", info={"task_id": task["id"]}) for task in tasks], 1,
        tokenizer=tokenizer, backend=backend, stop_token_ids=[tokenizer.eos_token_id], context_length=2048,
        max_tokens=128, temperature=1.0, seed=0, template_kwargs={},
    )
    return opened, tasks, backend, rollouts, tokenizer


def _split(rollout, tokenizer) -> tuple[str, str]:
    """A rollout's sampled text (loss mask 1) and the rest of its tokens (mask 0), decoded."""
    completion = rollout.completion
    kept = [token for token, mask in zip(completion.token_ids, completion.loss_mask) if mask]
    dropped = [token for token, mask in zip(completion.token_ids, completion.loss_mask) if not mask]
    return tokenizer.decode(kept, skip_special_tokens=False), tokenizer.decode(dropped, skip_special_tokens=False)


def _binary_search(prompt: str) -> str:
    """Guess by bisection over 1..10, reading the game's earlier hints from the rendered prompt."""
    low, high = 1, 10
    for guess, hint in re.findall(r"<guess>(\d+)</guess><\|im_end\|>\n<\|im_start\|>user\n(Higher|Lower)\.", prompt):
        low, high = (int(guess) + 1, high) if hint == "Higher" else (low, int(guess) - 1)
    return f"<guess>{(low + high) // 2}</guess>"


def test_a_multi_turn_game_runs_its_env_response_between_the_policys_turns_and_trains_on_the_guesses_only(bridge):
    opened, (task,), backend, (rollout,), tokenizer = _episodes(bridge, GUESS, {"num_examples": 4, "max_turns": 4}, _binary_search)
    assert (opened["multi_turn"], opened["tools"], opened["agents"]) == (True, False, [{"name": "agent"}])
    assert opened["rewards"] == [
        {"name": "solved", "weight": 1.0}, {"name": "closeness", "weight": 0.2}, {"name": "guesses", "weight": 0.0},
        {"name": "num_turns", "weight": 0.0},
    ]
    rng = random.Random(0)
    target = [rng.randint(1, 10) for _ in range(4)][task["idx"]]  # the fixture's own draw
    guesses = [int(guess) for guess in re.findall(r"<guess>(\d+)</guess>", rollout.text)]
    assert guesses[-1] == target and len(guesses) == len(backend.prompts) == rollout.turns <= 4
    # The game's rubric scored verifiers' own rollout: found, on the spot, in so many guesses.
    assert rollout.functions == {"solved": 1.0, "closeness": 1.0, "guesses": float(len(guesses)), "num_turns": float(len(guesses))}
    assert rollout.reward == pytest.approx(1.2)
    assert rollout.stop_condition == "has_final_env_response"
    hints = ["Higher." if guess < target else "Lower." for guess in guesses[:-1]]
    sampled, masked = _split(rollout, tokenizer)
    assert sampled == "".join(f"<guess>{guess}</guess><|im_end|>" for guess in guesses)
    assert masked == "".join(HINT.format(hint) for hint in hints)  # the game's turns never enter the loss
    assert rollout.text == "\n\n".join(
        [f"[assistant]\n<guess>{guesses[0]}</guess>"]
        + [f"[user]\n{hint}\n\n[assistant]\n<guess>{guess}</guess>" for hint, guess in zip(hints, guesses[1:])]
    )


def _arithmetic(prompt: str) -> str:
    """Multiply with the tool, then add with it, then answer with what the tools said."""
    a, b, c = map(int, re.search(r"What is (\d+) \* (\d+) \+ (\d+)\?", prompt).groups())
    results = re.findall(r"<\|im_start\|>tool\n(\d+)<\|im_end\|>", prompt)
    if not results:
        return _call("multiply", a=a, b=b)
    if len(results) == 1:
        return _call("add", a=int(results[0]), b=c)
    return f"<answer>{results[1]}</answer>"


def test_a_tool_environment_runs_the_python_tools_the_policy_calls_and_masks_their_results_out(bridge):
    opened, (task,), backend, (rollout,), tokenizer = _episodes(bridge, TOOLS, {"num_examples": 4, "max_turns": 4}, _arithmetic)
    assert (opened["multi_turn"], opened["tools"]) == (True, True)
    a, b, c = map(int, re.search(r"What is (\d+) \* (\d+) \+ (\d+)\?", task["messages"][-1]["content"]).groups())
    multiply, add, answer = _call("multiply", a=a, b=b), _call("add", a=a * b, b=c), f"<answer>{a * b + c}</answer>"
    # The tool results came back as tool turns after the replies that called them, as sampled.
    assert backend.prompts[1].endswith(f"<|im_start|>assistant\n{multiply}<|im_end|>{TOOL_TURN.format(a * b)}")
    assert backend.prompts[2].endswith(f"{add}<|im_end|>{TOOL_TURN.format(a * b + c)}")
    assert rollout.functions == {
        "correct": 1.0, "num_turns": 3.0, "total_tool_calls": 2.0, "add_calls": 1.0, "multiply_calls": 1.0,
    }
    assert (rollout.reward, rollout.turns, rollout.stop_condition) == (1.0, 3, "no_tools_called")
    sampled, masked = _split(rollout, tokenizer)
    assert sampled == f"{multiply}<|im_end|>{add}<|im_end|>{answer}<|im_end|>"
    assert masked == TOOL_TURN.format(a * b) + TOOL_TURN.format(a * b + c)


def test_a_stateful_tool_environment_fills_the_hidden_argument_from_each_episodes_own_state(bridge):
    opened = bridge.request("open", taskset=VAULT, args={"num_examples": 4})
    handle = opened["handle"]
    tasks = bridge.request("tasks", handle=handle, split="eval", start=0, n=2, seed=0)["tasks"]
    answer = bridge.request("start", handle=handle, task_ids=[task["id"] for task in tasks], limits={})
    assert len(answer["requests"]) == 2 and answer["finished"] == []
    # The model is shown the tool without the argument the environment fills in.
    (tool,) = answer["requests"][0]["tools"]
    assert tool["function"]["name"] == "open_drawer" and set(tool["function"]["parameters"]["properties"]) == {"color"}
    rng = random.Random(0)
    vaults = []
    for _ in range(4):
        vaults.append({color: str(rng.randint(1000, 9999)) for color in ("red", "green", "blue")})
        rng.choice(("red", "green", "blue"))
    colors = {request["episode"]: re.search(r"the code in the (\w+) drawer", request["messages"][-1]["content"]).group(1)
              for request in answer["requests"]}
    answer = bridge.request("reply", handle=handle, answers=[
        {"request": request["request"], "text": _call("open_drawer", color=colors[request["episode"]]), "input_tokens": 40, "output_tokens": 20}
        for request in answer["requests"]
    ])
    codes = {}
    for request, task in zip(answer["requests"], tasks):
        *_, call, result = request["messages"]
        assert call == {"role": "assistant", "content": _call("open_drawer", color=colors[request["episode"]])}
        assert result == {"role": "tool", "content": vaults[task["idx"]][colors[request["episode"]]], "tool_call_id": "call_1_0"}
        codes[request["episode"]] = result["content"]
    assert len(set(codes.values())) == 2  # each episode read its own vault
    answer = bridge.request("reply", handle=handle, answers=[
        {"request": request["request"], "text": f"<answer>{codes[request['episode']]}</answer>", "input_tokens": 60, "output_tokens": 10}
        for request in answer["requests"]
    ])
    assert answer["requests"] == []
    assert sorted((result["reward"], result["functions"]["correct"], result["functions"]["drawers_opened"], result["turns"])
                  for result in answer["finished"]) == [(1.0, 1.0, 1.0, 2)] * 2


def test_the_jobs_caps_and_the_engines_refusals_end_an_episode_where_verifiers_would(bridge):
    def guesses(limits, refuse_second=None) -> dict:
        opened = bridge.request("open", taskset=GUESS, args={"num_examples": 4, "max_number": 1000})
        handle = opened["handle"]
        (task,) = bridge.request("tasks", handle=handle, split="train", start=0, n=1, seed=0)["tasks"]
        answer = bridge.request("start", handle=handle, task_ids=[task["id"]], limits=limits)
        for turn in range(10):
            if not answer["requests"]:
                (result,) = answer["finished"]
                return result
            (request,) = answer["requests"]
            reply = {"stop": refuse_second} if turn == 1 and refuse_second else {"text": "<guess>0</guess>", "input_tokens": 100, "output_tokens": 5}
            answer = bridge.request("reply", handle=handle, answers=[{"request": request["request"], **reply}])
        raise AssertionError("the episode never ended")

    own = guesses({})  # the environment's own max_turns (4)
    assert (own["turns"], own["stop_condition"]) == (4, "max_turns_reached")
    capped = guesses({"max_turns": 2})  # the job's cap tightens verifiers' max_turns
    assert (capped["turns"], capped["stop_condition"], capped["functions"]["num_turns"]) == (2, "max_turns_reached", 2.0)
    fed = guesses({"max_input_tokens": 150})  # refused once 200 tokens were fed in: soft by one turn
    assert (fed["turns"], fed["stop_condition"]) == (2, "max_input_tokens")
    refused = guesses({}, refuse_second="context_length")  # the engine refused the second turn: scored as it stands
    assert (refused["turns"], refused["stop_condition"], refused["functions"]["guesses"]) == (1, "context_length", 1.0)


def _eval_tasks(bridge, handle: int, n: int) -> dict[str, dict]:
    """The first ``n`` tasks of the eval split (dataset order) by their question."""
    tasks = bridge.request("tasks", handle=handle, split="eval", start=0, n=n, seed=0)["tasks"]
    return {task["messages"][-1]["content"]: task for task in tasks}


def test_an_env_group_builds_as_multi_turn_with_every_members_reward_functions_and_plays_its_smoke_rollout(built):
    summary = built["summary"]
    assert (summary["environment_class"].rsplit(".", 1)[-1], summary["multi_turn"]) == ("EnvGroup", True)
    functions = {function["name"]: function["weight"] for function in summary["reward_functions"]}
    assert {"repeated": 1.0, "spelled": 1.0, "turns": 0.0}.items() <= functions.items()
    assert summary["rollout"]["examples"] >= 1, summary["rollout"]


def test_an_env_group_of_single_turn_environments_scores_each_row_with_its_own_members_rubric(bridge):
    opened = bridge.request("open", taskset=MIXTURE, args={"num_examples": 2, "spelling": False})
    handle = opened["handle"]
    assert (opened["multi_turn"], opened["tools"], opened["sizes"]["train"]) == (False, False, 4)
    # Every member's functions (verifiers' own num_turns among them), each with its member's weight.
    weights = {"num_turns": 0.0, "repeated": 1.0, "shouted": 0.5}
    assert opened["rewards"] == [{"name": name, "weight": weight} for name, weight in weights.items()]
    tasks = _eval_tasks(bridge, handle, 4)
    repeat, shout = tasks["Repeat the word apple."], tasks["Say apple in capitals."]

    def score(task, completion):
        return bridge.request("score", handle=handle, task_id=task["id"], completion=completion)

    assert score(repeat, "apple") == {"reward": 1.0, "functions": {"num_turns": 1.0, "repeated": 1.0, "shouted": 0.0}, "weights": weights}
    assert score(shout, "APPLE") == {"reward": 0.5, "functions": {"num_turns": 1.0, "repeated": 0.0, "shouted": 1.0}, "weights": weights}
    assert score(shout, "apple")["reward"] == 0.0


def test_an_env_group_with_a_game_plays_each_row_as_an_episode_of_its_own_member(bridge):
    opened = bridge.request("open", taskset=MIXTURE, args={"num_examples": 2})
    handle = opened["handle"]
    assert (opened["multi_turn"], opened["agents"]) == (True, [{"name": "agent"}])
    names = [reward["name"] for reward in opened["rewards"]]
    assert {"repeated", "spelled", "turns"} <= set(names)
    tasks = _eval_tasks(bridge, handle, 4)
    repeat, spell = tasks["Repeat the word apple."], tasks["Spell apple in two halves, one per turn."]

    def reply(request) -> str:
        last = request["messages"][-1]["content"]
        return "apple" if last.startswith("Repeat") else "le" if last == "Go on." else "app"

    answer = bridge.request("start", handle=handle, task_ids=[repeat["id"], spell["id"]], limits={})
    episodes, finished = answer["episodes"], list(answer["finished"])
    while answer["requests"]:
        answer = bridge.request("reply", handle=handle, answers=[
            {"request": request["request"], "text": reply(request), "input_tokens": 5, "output_tokens": 2} for request in answer["requests"]])
        finished += answer["finished"]
    results = {result["episode"]: result for result in finished}
    played_repeat, played_spell = results[episodes[0]], results[episodes[1]]
    assert (played_repeat["reward"], played_repeat["turns"]) == (1.0, 1)
    assert (played_repeat["functions"]["repeated"], played_repeat["functions"]["spelled"]) == (1.0, 0.0)
    assert (played_spell["reward"], played_spell["turns"]) == (1.0, 2)
    assert (played_spell["functions"]["spelled"], played_spell["functions"]["turns"], played_spell["functions"]["repeated"]) == (1.0, 2.0, 0.0)


def test_an_environment_lab_does_not_run_is_refused_and_a_crashing_one_fails_its_episode(bridge):
    with pytest.raises(BridgeRefused) as refused:
        bridge.request("open", taskset="acme/own-loop@0.1.0", args={})
    assert refused.value.code == "unsupported"
    assert str(refused.value) == (
        "environment acme/own-loop@0.1.0 is a OwnLoop, whose own rollout Lab does not run yet: Lab runs SingleTurnEnv, "
        "MultiTurnEnv, ToolEnv and StatefulToolEnv environments (and their subclasses), and EnvGroups of them"
    )
    with pytest.raises(BridgeRefused) as refused:
        bridge.request("open", taskset="acme/sandboxed-game@0.1.0", args={})
    assert (refused.value.code, str(refused.value)) == ("unsupported", (
        "environment acme/sandboxed-game@0.1.0 is a CliAgentEnv (CliAgentEnv): it runs its tools or agent in a sandbox "
        "Lab does not give load_environment environments yet (a SandboxEnv's bash tool and a PythonEnv's python tool run)"
    ))
    opened = bridge.request("open", taskset="acme/crashing-game@0.1.0", args={})
    (task,) = bridge.request("tasks", handle=opened["handle"], split="train", start=0, n=1, seed=0)["tasks"]
    answer = bridge.request("start", handle=opened["handle"], task_ids=[task["id"]], limits={})
    answer = bridge.request("reply", handle=opened["handle"], answers=[
        {"request": answer["requests"][0]["request"], "text": "hello", "input_tokens": 5, "output_tokens": 5}])
    assert answer == {"requests": [], "finished": [{"episode": "e1", "error": "RuntimeError: the referee fell over"}]}


def _engine(tmp_path: Path, built, env_id: str, fixture: str, *, args: dict, extra_env: dict | None = None,
            wheel: tuple[str, bytes] | None = None, build: dict | None = None):
    """Run a tiny-model job of one step on a fixture package's build, evaluated on two examples of
    its eval split after the step; return the finished process."""
    evaluation = {"interval": 1, "env": [{"id": env_id, "num_examples": 2, "args": args, "max_turns": 2}]}
    return run_engine(
        tmp_path, env_id, [wheel or fixture_wheel(fixture)], args=args, block={"max_turns": 2},
        spec={"max_steps": 1, "eval": evaluation},
        build={"number": 1, "api": "v0", "lock": built["lock"], **(build or {})},
        extra_env={build_envs.CACHE_VARIABLE: str(built["root"] / "cache"), **(extra_env or {})},
    )


def _metrics_and_samples(tmp_path: Path) -> tuple[dict, list[dict]]:
    """The job's metric values, its steps' points merged (its evals are points of their own, at
    step 0 before training and after the step), and its samples."""
    work = tmp_path / "work"
    points = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    values = {name: value for point in points for name, value in point["values"].items()}
    return values, [json.loads(line) for line in (work / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("env_id", "fixture", "functions"), [
    (GUESS, "number-guess", {"solved", "closeness", "guesses", "num_turns"}),
    (TOOLS, "tool-arithmetic", {"correct", "num_turns", "total_tool_calls", "add_calls", "multiply_calls"}),
    (VAULT, "vault-lookup", {"correct", "drawers_opened", "num_turns", "total_tool_calls", "open_drawer_calls"}),
    (MIXTURE, "word-mixture", {"repeated", "spelled", "turns", "num_turns"}),
], ids=["multi-turn", "tool", "stateful-tool", "env-group"])
def test_a_tiny_model_job_trains_on_each_kind_with_every_reward_function_reported(tmp_path, built, env_id, fixture, functions):
    result = _engine(tmp_path, built, env_id, fixture, args={"num_examples": 8})
    assert result.returncode == 0, result.stderr[-3000:]
    values, samples = _metrics_and_samples(tmp_path)
    name = env_id.split("/")[1].split("@")[0]
    assert {f"reward/{name}/mean", *(f"reward/{name}/{function}/mean" for function in functions)} <= set(values), sorted(values)
    assert {f"eval/{name}/mean", *(f"eval/{name}/{function}/mean" for function in functions)} <= set(values), sorted(values)
    assert len(samples) == 4
    assert all(set(sample["metrics"]) == functions and sample["completion"].startswith("[assistant]\n") for sample in samples)
    assert all(1 <= sample["metrics"]["num_turns"] <= 2 for sample in samples)  # the block's max_turns = 2
