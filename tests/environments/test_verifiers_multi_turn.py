"""The engine trains on multi-turn verifiers v1 environments: a package's own `vf.Env` runs in the
verifiers bridge (.venv-verifiers' Python), its agents' turns answered by Lab's policy round by
round, and the rollout's reward is what the environment's own code recorded."""

from __future__ import annotations

import io
import json
import time
import zipfile

import pytest

from engine.environments.verifiers_taskset import Bridge, BridgeRefused, verifiers_python
from tests.environments.verifiers_wheels import (
    GUESS_ENV,
    guess_wheel,
    read_lines,
    require_verifiers_python,
    run_in_verifiers,
)
from tests.support.packages import run_engine

ENV_ID = "acme/guess-env@0.1.0"
ARGS = {"num_tasks": 40, "log_path": "episodes.jsonl"}
FUNCTIONS = {"solved", "closeness", "numeric"}


def replied_transcript(messages: list[dict]) -> str:
    """The conversation after the opening messages up to the last reply, as Lab's samples write it."""
    last = max(index for index, message in enumerate(messages) if message["role"] == "assistant")
    return "\n\n".join(f"[{message['role']}]\n{message['content']}" for message in messages[2:last + 1])


# Plays each logged episode again through the package's own GuessEnv.run, with an agent that
# replays the logged replies (and ends the exchange when they run out, as a turn cap does) and
# scores the trace with the task's own reward functions when the interaction closes.
_REPLAY = r'''
import asyncio, contextlib, json, sys
sys.path.append(sys.argv[1])
from verifiers.v1.agent import Segment
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage
import guess_env

tasks = {task.data.prompt: task for task in guess_env.GuessTaskset(guess_env.GuessConfig(id="guess-env", num_tasks=40))}


class Replay:
    def __init__(self, task, replies):
        self.replies = list(replies)
        agent = AgentInfo(config=AgentConfig.model_validate({"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}))
        self.trace = Trace(task=TraceTask(type="GuessTask", data=task.data), agent=agent, nodes=[
            MessageNode(message=SystemMessage(content=task.data.system_prompt)),
            MessageNode(parent=0, message=UserMessage(content=task.data.prompt))])

    def add(self, message, sampled=False):
        self.trace.nodes.append(MessageNode(parent=len(self.trace.nodes) - 1, message=message, sampled=sampled))

    async def turn(self, message=None):
        if message is not None:
            self.add(UserMessage(content=message))
        if not self.replies:
            return Segment(messages=[], terminated=True)
        reply = AssistantMessage(content=self.replies.pop(0))
        self.add(reply, sampled=True)
        return Segment(messages=[reply])


class Player:
    def __init__(self, replay):
        self.replay = replay

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        yield self.replay
        await task.score(self.replay.trace)


class Agents:
    def __init__(self, replay):
        self.player = Player(replay)


answers = []
for record in map(json.loads, open(sys.argv[2])):
    task = tasks[record["prompt"]]
    replay = Replay(task, record["replies"])
    asyncio.run(guess_env.GuessEnv.run(None, task, Agents(replay)))
    answers.append({name: [reward.score, reward.weight] for name, reward in replay.trace.rewards.items()})
print(json.dumps(answers))
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One job on the guessing game, at most three turns an episode: its work dir."""
    require_verifiers_python()
    root = tmp_path_factory.mktemp("guess")
    result = run_engine(root, ENV_ID, [guess_wheel()], args=ARGS, block={"max_turns": MAX_TURNS})
    assert result.returncode == 0, result.stderr
    return root / "work"


MAX_TURNS = 3


def test_it_trains_on_a_multi_turn_environment_with_the_rewards_its_own_code_records(trained, tmp_path):
    work = trained
    points = read_lines(work / "metrics.jsonl")
    assert [point["step"] for point in points] == [1, 2]
    for point in points:
        values = point["values"]
        assert {f"reward/guess-env/{name}/mean" for name in FUNCTIONS} <= set(values)
        # The rollout's reward is verifiers' trace.reward: solved x 1 + closeness x 0.5 + numeric x 0.25.
        expected = sum(values[f"reward/guess-env/{name}/mean"] * weight for name, weight in
                       (("solved", 1.0), ("closeness", 0.5), ("numeric", 0.25)))
        assert abs(values["reward/guess-env/mean"] - expected) < 1e-9

    episodes = read_lines(work / "episodes.jsonl")
    assert len(episodes) == 8  # two steps of four rollouts, each one episode of the environment's own run()
    assert all(episode["agents"] == ["player"] for episode in episodes)
    assert max(episode["turns"] for episode in episodes) == MAX_TURNS
    several = [episode for episode in episodes if episode["turns"] > 1]
    assert several, "no episode took more than one turn"
    assert any(message["role"] == "user" and message["content"].endswith("Guess again.")
               for episode in several for message in episode["messages"][2:])

    # Every rollout Lab reports is one of the environment's episodes, with the rewards it recorded.
    samples = read_lines(work / "samples.jsonl")
    assert len(samples) == 8
    by_transcript = {(episode["prompt"], replied_transcript(episode["messages"])): episode for episode in episodes}
    for sample in samples:
        matches = [episode for (prompt, transcript), episode in by_transcript.items()
                   if prompt in sample["prompt"] and transcript == sample["completion"]]
        assert len(matches) == 1, sample["completion"]
        (episode,) = matches
        assert sample["reward"] == episode["reward"]
        assert sample["metrics"] == {name: score for name, (score, _) in episode["rewards"].items()}
    assert any(sample["completion"].count("[assistant]") > 1 for sample in samples)

    # The package's own code, replaying the same replies, records the same rewards.
    replay = run_in_verifiers(_REPLAY, str(work / "environments" / "site"), str(work / "episodes.jsonl"), cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout) == [episode["rewards"] for episode in episodes]
    assert len({episode["reward"] for episode in episodes}) > 1  # the rewards differ: not a comparison of constants


def test_max_turns_bounds_every_episode(trained):
    episodes = read_lines(trained / "episodes.jsonl")
    assert len(episodes) == 8
    for episode in episodes:
        solved = episode["rewards"]["solved"][0] == 1.0
        assert episode["turns"] == MAX_TURNS or (solved and episode["turns"] < MAX_TURNS), episode
        assert episode["stop_condition"] == ("user_closed" if solved else "max_turns"), episode
    assert all(sample["completion"].count("[assistant]") <= MAX_TURNS for sample in read_lines(trained / "samples.jsonl"))


#: A second agent, the host: untrainable (its tokens are never training data), answered by the same
#: policy, its reply relayed to the player with each feedback.
HOSTED_ENV = GUESS_ENV.replace(
    "    player: vf.AgentConfig = vf.AgentConfig()\n",
    '    player: vf.AgentConfig = vf.AgentConfig()\n    host: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})\n',
).replace(
    "    async def run(self, task, agents):\n        secret, last, solved = task.data.secret, None, False\n"
    "        async with agents.player.interaction(task) as interaction:\n",
    "    async def setup(self, agents):\n        agents.host.trainable = False\n\n"
    "    async def run(self, task, agents):\n        secret, last, solved = task.data.secret, None, False\n"
    '        host_task = vf.Task(vf.TaskData(idx=task.data.idx, prompt=None, system_prompt="You host a guessing game."))\n'
    "        async with agents.host.interaction(host_task) as host, agents.player.interaction(task) as interaction:\n",
).replace(
    '                segment = await interaction.turn(feedback + " Guess again.")\n',
    '                hint = await host.turn(f"The player guessed {guess}.")\n'
    "                if not hint.terminated:\n"
    '                    feedback += " The host says: " + hint.last_reply\n'
    '                segment = await interaction.turn(feedback + " Guess again.")\n',
)


def test_an_untrainable_agent_is_answered_by_the_policy_and_never_trained_on(tmp_path):
    require_verifiers_python()
    assert HOSTED_ENV.count("host") > 5, "the host variant no longer applies to GUESS_ENV"
    result = run_engine(tmp_path, "acme/hosted-guess@0.1.0", [guess_wheel("hosted-guess", source=HOSTED_ENV)],
                        args=ARGS, block={"max_turns": 3})
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    episodes = read_lines(work / "episodes.jsonl")
    assert len(episodes) == 8 and all(episode["agents"] == ["host", "player"] for episode in episodes)
    samples = read_lines(work / "samples.jsonl")
    assert len(samples) == 8  # one rollout per episode: the host's turns are no rollout
    relayed = [sample for sample in samples if "The host says:" in sample["completion"]]
    assert relayed, "no host reply reached the player"
    # The player's rollout holds the host's words only inside the environment's turns.
    assert all(not block.startswith("[assistant]\n") or "The host says:" not in block
               for sample in samples for block in sample["completion"].split("\n\n"))


def test_it_exits_2_for_an_agent_that_runs_a_harness(tmp_path):
    require_verifiers_python()
    source = GUESS_ENV.replace("    player: vf.AgentConfig = vf.AgentConfig()\n",
                               '    player: vf.AgentConfig = vf.AgentConfig(harness={"id": "bash"})\n')
    assert source != GUESS_ENV
    result = run_engine(tmp_path, "acme/bash-guess@0.1.0", [guess_wheel("bash-guess", source=source)])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "engine: environment acme/bash-guess@0.1.0: its agent 'player' runs the harness 'bash', which Lab does not run "
        "(Lab's policy answers each agent's turns as a plain chat)"
    )
    assert json.loads((tmp_path / "work" / "finish.json").read_text())["error"]["code"] == "environment_error"


FEEDBACK = '                segment = await interaction.turn(feedback + " Guess again.")\n'


def test_an_episode_whose_environment_fails_runs_again_within_its_retries_and_past_them_fails_the_job(tmp_path):
    """[[env]] retries: an episode whose Env.run raised is run again from its start, in the live
    bridge beside the other episodes; an environment that keeps failing fails the job with exit 2
    (the job's fault, environment_error) once the retries are spent."""
    require_verifiers_python()
    # Each task's first episode raises at its first feedback, once: the referee comes back.
    flaky = GUESS_ENV.replace("import verifiers.v1 as vf\n", "import verifiers.v1 as vf\n\nLEFT = set()\n").replace(
        FEEDBACK,
        '                if task.data.prompt not in LEFT:\n'
        '                    LEFT.add(task.data.prompt)\n'
        '                    raise RuntimeError("the referee left")\n' + FEEDBACK,
    )
    assert flaky.count("LEFT") == 3
    (tmp_path / "flaky").mkdir()
    result = run_engine(tmp_path / "flaky", "acme/flaky-guess@0.1.0", [guess_wheel("flaky-guess", source=flaky)],
                        block={"max_turns": 3, "retries": 1})
    assert result.returncode == 0, result.stderr
    retried = [line for line in result.stderr.splitlines() if "running it again, retry 1 of 1" in line]
    assert retried and all("an episode failed (environment acme/flaky-guess@0.1.0: an episode failed: " in line for line in retried)
    assert all("the referee left" in line for line in retried)
    points = read_lines(tmp_path / "flaky" / "work" / "metrics.jsonl")
    assert [point["step"] for point in points] == [1, 2]

    broken = GUESS_ENV.replace(FEEDBACK, '                raise RuntimeError("the referee left")\n')
    result = run_engine(tmp_path, "acme/broken-guess@0.1.0", [guess_wheel("broken-guess", source=broken)],
                        block={"max_turns": 3, "retries": 1})
    assert result.returncode == 2, result.stderr
    assert "running it again, retry 1 of 1" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("engine: environment acme/broken-guess@0.1.0: an episode failed: ") and "the referee left" in last, last
    assert json.loads((tmp_path / "work" / "finish.json").read_text())["error"]["code"] == "environment_error"


def test_the_bridge_refuses_an_agents_turn_once_it_reaches_a_token_cap(tmp_path):
    """verifiers' RolloutLimits: checked before each turn, so the turn that crosses a cap completes."""
    require_verifiers_python()
    _, data = guess_wheel()
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp_path / "site")
    bridge = Bridge(python=verifiers_python(), site=tmp_path / "site", workdir=tmp_path, package_id=ENV_ID)
    try:
        handle = bridge.request("open", taskset=ENV_ID, args={"num_tasks": 8})["handle"]
        (task,) = bridge.request("tasks", handle=handle, split="train", start=0, n=1, seed=0)["tasks"]

        def play(limits, *, input_tokens, output_tokens):
            answer = bridge.request("start", handle=handle, task_ids=[task["id"]], limits=limits)
            while answer["requests"]:
                answer = bridge.request("reply", handle=handle, answers=[
                    {"request": request["request"], "text": "no", "input_tokens": input_tokens, "output_tokens": output_tokens}
                    for request in answer["requests"]
                ])
            (finished,) = answer["finished"]
            return finished["turns"], finished["stop_condition"]

        assert play({"max_output_tokens": 5}, input_tokens=1, output_tokens=3) == (2, "max_output_tokens")
        assert play({"max_input_tokens": 10}, input_tokens=6, output_tokens=1) == (2, "max_input_tokens")
        assert play({"max_turns": 4, "max_output_tokens": None}, input_tokens=1, output_tokens=1) == (4, "max_turns")
    finally:
        bridge.close()


#: Every second episode started stalls after its first reply, far past any test's timeout.
STALLING_ENV = GUESS_ENV.replace(
    "import verifiers.v1 as vf\n", "import asyncio\nimport itertools\n\nimport verifiers.v1 as vf\n\nSTARTED = itertools.count()\n",
).replace(
    "        secret, last, solved = task.data.secret, None, False\n"
    "        async with agents.player.interaction(task) as interaction:\n"
    "            segment = await interaction.turn()\n",
    "        secret, last, solved = task.data.secret, None, False\n"
    "        stalls = next(STARTED) % 2 == 1\n"
    "        async with agents.player.interaction(task) as interaction:\n"
    "            segment = await interaction.turn()\n"
    "            if stalls:\n"
    "                await asyncio.sleep(60)\n",
)


def test_the_bridge_ends_an_episode_past_its_timeout_as_verifiers_does(tmp_path):
    """[[env]] timeout is verifiers' episode deadline (Env.run_episode's timeout.episode): an
    episode past it is cancelled, flagged timed out and never scored, the others unaffected; an
    answer that comes after its episode's deadline passed is dropped, not an error."""
    require_verifiers_python()
    assert STALLING_ENV.count("stalls") == 2 and "STARTED = " in STALLING_ENV
    _, data = guess_wheel("stalling-guess", source=STALLING_ENV)
    zipfile.ZipFile(io.BytesIO(data)).extractall(tmp_path / "site")
    package = "acme/stalling-guess@0.1.0"
    bridge = Bridge(python=verifiers_python(), site=tmp_path / "site", workdir=tmp_path, package_id=package)
    try:
        handle = bridge.request("open", taskset=package, args={"num_tasks": 8, "log_path": "episodes.jsonl"})["handle"]
        (task,) = bridge.request("tasks", handle=handle, split="train", start=0, n=1, seed=0)["tasks"]
        started = bridge.request("start", handle=handle, task_ids=[task["id"]] * 2, limits={"max_turns": 1}, timeout_s=1.5)
        assert [request["episode"] for request in started["requests"]] == started["episodes"] == ["e1", "e2"]
        answer = bridge.request("reply", handle=handle, answers=[
            {"request": request["request"], "text": "0", "input_tokens": 1, "output_tokens": 1} for request in started["requests"]
        ])
        assert answer["requests"] == []
        first, second = answer["finished"]  # e1 ends at once (its one turn is spent), e2 at its deadline
        assert (first["episode"], first["stop_condition"], first["turns"]) == ("e1", "max_turns", 1)
        assert second == {"episode": "e2", "timeout": True,
                          "error": "GuessEnv.run() exceeded its 1.5s deadline (--env.timeout.episode)"}
        # Only the episode that finished reached finalize: a timed-out one has no trace to judge.
        assert len(read_lines(tmp_path / "episodes.jsonl")) == 1

        # The deadline passes while the engine samples: the late replies are dropped, both time out.
        started = bridge.request("start", handle=handle, task_ids=[task["id"]] * 2, timeout_s=0.5)
        time.sleep(1.0)
        answer = bridge.request("reply", handle=handle, answers=[
            {"request": request["request"], "text": "0", "input_tokens": 1, "output_tokens": 1} for request in started["requests"]
        ])
        assert answer["requests"] == [] and [result.get("timeout") for result in answer["finished"]] == [True, True]
        with pytest.raises(BridgeRefused) as refused:
            bridge.request("start", handle=handle, task_ids=[task["id"]], timeout_s=0)
        assert refused.value.code == "invalid_request"
    finally:
        bridge.close()


def test_an_episode_past_its_timeout_counts_as_timed_out_and_the_job_reports_how_many(tmp_path):
    """Through the engine: the stalled episode of each group ends at its [[env]] timeout with
    reward 0 and no function scored, out of its group's advantages and the loss; each step
    reports is_timeout/mean, each eval eval/<env>/is_timeout/mean, and the job finishes."""
    require_verifiers_python()
    result = run_engine(tmp_path, "acme/stalling-guess@0.1.0", [guess_wheel("stalling-guess", source=STALLING_ENV)],
                        args=ARGS, block={"max_turns": 1, "timeout": 3}, spec={"eval": {"interval": 2, "num_examples": 2}})
    assert result.returncode == 0, result.stderr
    work = tmp_path / "work"
    points = read_lines(work / "metrics.jsonl")
    training = [point for point in points if "is_timeout/mean" in point["values"]]
    assert [(point["step"], point["values"]["is_timeout/mean"]) for point in training] == [(1, 0.5), (2, 0.5)]
    # The base model's eval and step 2's: two episodes each, the second of which stalls.
    evals = [(point["step"], point["values"]["eval/stalling-guess/is_timeout/mean"]) for point in points
             if "eval/stalling-guess/mean" in point["values"]]
    assert evals == [(0, 0.5), (2, 0.5)]
    # Episodes start row by row, so in each group of two the second stalls.
    samples = read_lines(work / "samples.jsonl")
    assert len(samples) == 8
    stalled = [sample for row, sample in enumerate(samples) if row % 2 == 1]
    assert all(sample["reward"] == 0.0 and sample["advantage"] == 0.0 for sample in stalled)
    assert all(set(sample["metrics"].values()) == {0.0} for sample in stalled)
    assert all(sample["completion"].count("[assistant]") == 1 for sample in samples)
    # finalize ran for the finished episodes only: 4 of training's 8, 2 of the evals' 4.
    assert len(read_lines(work / "episodes.jsonl")) == 6
