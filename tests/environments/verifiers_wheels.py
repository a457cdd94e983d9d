"""verifiers v1 taskset wheels built in tests (offline, procedural, no data download), and the
verifiers environment's Python that runs them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from engine.environments.verifiers_taskset import verifiers_python
from tests.environments.wheelbuilder import build_wheel

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
