"""verifiers v1 taskset wheels built in tests (offline, procedural, no data download), and the
verifiers environment's Python that runs them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from engine.environments.verifiers_taskset import verifiers_python
from tests.support.wheelbuilder import build_wheel

#: A single-turn taskset: spell a made-up word backwards. Three reward functions: `exact` (weight
#: 1), `letters` (weight 0.5: the share of the reply's characters that are the word's letters, so
#: even a random tiny model's replies score between 0 and 1) and `short` (weight 0, a metric only).
#: ``{prelude}`` is code run at import (a missing dependency, a probe).
SPELL_TASKSET = '''"""Spell a made-up word backwards."""
import random

import verifiers.v1 as vf
{prelude}

class SpellConfig(vf.TasksetConfig):
    num_tasks: int = 64
    max_length: int = 5
    letters: str = "abcde"


class SpellData(vf.TaskData):
    word: str


class SpellTask(vf.Task[SpellData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply == self.data.word[::-1] else 0.0

    @vf.reward(weight=0.5)
    async def letters(self, trace: vf.Trace) -> float:
        reply = trace.last_reply
        return sum(character in self.data.word for character in reply) / len(reply) if reply else 0.0

    @vf.reward(weight=0.0)
    async def short(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= len(self.data.word) else 0.0


class SpellTaskset(vf.Taskset[SpellTask, SpellConfig]):
    """Spell a made-up word backwards; 1 for the exact reversal."""

    def load(self):
        rng = random.Random(7)
        for index in range(self.config.num_tasks):
            length = rng.randint(2, self.config.max_length)
            word = "".join(rng.choice(self.config.letters) for _ in range(length))
            yield SpellTask(
                SpellData(
                    prompt=f"Task {{index}}: spell '{{word}}' backwards.",
                    system_prompt="Answer with the word only.",
                    word=word,
                ),
                self.config.task,
            )


__all__ = ["SpellTaskset"]
'''


def spell_wheel(name: str = "spell-env", version: str = "0.1.0", *, prelude: str = "", requires=("verifiers>=0.4.0",)) -> tuple[str, bytes]:
    """Return ``(file name, bytes)`` of a verifiers-form wheel whose module exports ``SpellTaskset``."""
    module = name.replace("-", "_")
    return build_wheel(name, version, files={f"{module}/__init__.py": SPELL_TASKSET.format(prelude=prelude)}, requires=list(requires))


def read_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file (an engine's metrics.jsonl, an environment's log)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def require_verifiers_python() -> Path:
    """Return the verifiers environment's Python; fail (never skip) when `make install` did not make it."""
    python = verifiers_python()
    if not python.exists():
        pytest.fail(f"{python} does not exist: run `make install` (it creates .venv-verifiers)")
    return python


def run_in_verifiers(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``script`` with the verifiers environment's Python (isolated mode)."""
    python = require_verifiers_python()
    return subprocess.run([str(python), "-I", "-c", script, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


#: A multi-turn verifiers v1 environment: guess a secret number, with feedback each turn. The
#: package exports its own ``vf.Env`` subclass, whose ``run`` drives the player's interaction turn
#: by turn ("Higher." / "Lower." / "That is not a number.") until the guess is right or the
#: player's turns run out, then records two rewards on the trace: ``solved`` (weight 1) and
#: ``closeness`` (weight 0.5: 1 - |last guess - secret| / max_number, so even a random tiny
#: model's replies score something). The task adds its own reward function, ``numeric`` (weight
#: 0.25: the share of the player's replies that hold a number), which verifiers runs when the
#: interaction closes. ``finalize`` appends each finished episode (secret, replies, every reward)
#: to ``log_path`` when one is given: the environment's own record of what it scored.
GUESS_ENV = '''"""Guess a secret number from 1 to max_number, told higher or lower after each guess."""
import json
import random
import re

import verifiers.v1 as vf


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 64
    max_number: int = 20
    log_path: str = ""


class GuessData(vf.TaskData):
    secret: int
    max_number: int
    log_path: str = ""


def first_number(text):
    found = re.search(r"-?[0-9]+", text)
    return int(found.group()) if found else None


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.25)
    async def numeric(self, trace: vf.Trace) -> float:
        replies = [message.content or "" for message in trace.assistant_messages]
        return sum(first_number(reply) is not None for reply in replies) / len(replies) if replies else 0.0


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    """Guess a secret number; told higher or lower after each guess."""

    def load(self):
        rng = random.Random(11)
        for index in range(self.config.num_tasks):
            secret = rng.randint(1, self.config.max_number)
            yield GuessTask(
                GuessData(
                    prompt=f"Game {index}: I am thinking of a whole number from 1 to {self.config.max_number}. Guess it.",
                    system_prompt="Reply with one number.",
                    secret=secret, max_number=self.config.max_number, log_path=self.config.log_path,
                ),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret, last, solved = task.data.secret, None, False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guess = first_number(segment.last_reply)
                last = guess if guess is not None else last
                if guess == secret:
                    solved = True
                    break
                feedback = "That is not a number." if guess is None else "Higher." if guess < secret else "Lower."
                segment = await interaction.turn(feedback + " Guess again.")
        trace = interaction.trace
        trace.record_reward("solved", 1.0 if solved else 0.0, 1.0)
        distance = abs(last - secret) if last is not None else task.data.max_number
        trace.record_reward("closeness", max(0.0, 1.0 - distance / task.data.max_number), 0.5)

    async def finalize(self, task, episode):
        if not task.data.log_path:
            return
        (trace,) = [trace for trace in episode.traces if trace.agent.name == "player"]
        record = {
            "secret": task.data.secret,
            "prompt": task.data.prompt,
            "replies": [message.content or "" for message in trace.assistant_messages],
            "messages": [{"role": message.role, "content": message.content} for message in trace.messages],
            "agents": sorted(t.agent.name for t in episode.traces),
            "rewards": {name: [reward.score, reward.weight] for name, reward in trace.rewards.items()},
            "reward": trace.reward,
            "turns": trace.num_turns,
            "stop_condition": trace.stop_condition,
        }
        with open(task.data.log_path, "a") as log:
            log.write(json.dumps(record) + "\\n")


__all__ = ["GuessTaskset", "GuessEnv"]
'''


#: ``GUESS_ENV`` whose own turn code raises: the Env's ``run`` takes the player's first reply, then
#: raises ``RuntimeError("the referee left")`` where it would send its feedback (turn 2).
REFEREE_LEFT_ENV = GUESS_ENV.replace(
    '                feedback = "That is not a number."',
    '                raise RuntimeError("the referee left")\n                feedback = "That is not a number."',
)


def guess_wheel(name: str = "guess-env", version: str = "0.1.0", *, source: str = GUESS_ENV) -> tuple[str, bytes]:
    """Return ``(file name, bytes)`` of a verifiers-form wheel exporting ``GuessTaskset`` and ``GuessEnv``."""
    module = name.replace("-", "_")
    return build_wheel(name, version, files={f"{module}/__init__.py": source}, requires=["verifiers>=0.4.0"])


#: A tool-using verifiers v1 taskset: add two numbers with a calculator tool. Each task's tool
#: server (a ``vf.Toolset`` in its own module, started per rollout by verifiers as ``python -m
#: calc_env.tools``) fetches its task when it starts and appends ``start`` (its process id, the
#: task's idx) to the task's ``log_path``, then ``add`` (the arguments) on every call of its
#: ``add`` tool, advertised to the model as ``calc_add``. Rewards: ``correct`` (weight 1: the last
#: reply holds the sum) and ``used_tool`` (0.5: a tool result is in the conversation).
CALC_TASKSET = '''"""Add two numbers with the calculator's add tool."""
import random

import verifiers.v1 as vf


class CalcData(vf.TaskData):
    a: int
    b: int
    log_path: str = ""


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 32
    log_path: str = ""
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config):
        from calc_env.tools import CalcToolset  # imported here: the server runs as its own __main__

        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if str(self.data.a + self.data.b) in trace.last_reply else 0.0

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        return 1.0 if any(message.role == "tool" for message in trace.messages) else 0.0


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    """Add two numbers; the calculator's add tool knows the sum."""

    def load(self):
        rng = random.Random(5)
        for index in range(self.config.num_tasks):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            yield CalcTask(
                CalcData(prompt=f"Sum {index}: what is {a} + {b}? Use the calc_add tool.",
                         system_prompt="Call a tool, then answer with the number.", a=a, b=b,
                         log_path=self.config.log_path),
                self.config.task,
            )


__all__ = ["CalcTaskset"]
'''

CALC_TOOLS = '''"""The calculator's tool server: run per rollout by verifiers as ``python -m calc_env.tools``."""
import json
import os

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    async def setup_task(self, task):
        self.log_path = task.log_path  # the task's data, fetched over verifiers' /task channel
        self.log({"event": "start", "pid": os.getpid(), "idx": task.idx})

    def log(self, record):
        if getattr(self, "log_path", ""):
            with open(self.log_path, "a") as log:
                log.write(json.dumps(record) + "\\n")

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two whole numbers and return the sum."""
        self.log({"event": "add", "a": a, "b": b})
        return str(a + b)


if __name__ == "__main__":
    CalcToolset.run()
'''


def calc_wheel(name: str = "calc-env", version: str = "0.1.0") -> tuple[str, bytes]:
    """Return ``(file name, bytes)`` of a verifiers-form wheel exporting ``CalcTaskset``, whose tasks use a tool server."""
    module = name.replace("-", "_")
    files = {f"{module}/__init__.py": CALC_TASKSET.replace("calc_env", module), f"{module}/tools.py": CALC_TOOLS}
    return build_wheel(name, version, files=files, requires=["verifiers>=0.4.0"])
