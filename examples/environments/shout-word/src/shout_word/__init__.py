"""`shout-word`: write a made-up word in capital letters, and nothing else.

A verifiers v1 taskset (verifiers 0.4.0), in verifiers' own plugin form: this module is named
after the environment and exports its ``Taskset`` subclass in ``__all__``, which is how
``verifiers.v1`` (and Lab) find it. Words are drawn from a seeded generator, so nothing is
downloaded and every run sees the same tasks.

Reward functions (``@vf.reward``; Lab reports each as ``reward/shout-word/<name>/mean``):

- ``exact`` (weight 1): the reply is the word in capitals, nothing else;
- ``shouted`` (weight 0.5): the word in capitals appears somewhere in the reply;
- ``capitals`` (weight 0.25): the share of the reply's letters that are capitals, a dense signal
  a small model can climb before it gets the word right;
- ``terse`` (weight 0, reported only): the reply is a single word.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
_WORD = re.compile(r"[A-Za-z]+")


def _reply(trace: vf.Trace) -> str:
    """The model's reply without surrounding blanks, quotes or a final full stop."""
    return trace.last_reply.strip().strip("\"'`*").rstrip(".!").strip()


class ShoutConfig(vf.TasksetConfig):
    """The taskset's arguments (a Lab spec's ``env.args``)."""

    num_tasks: int = 2000
    min_syllables: int = 2
    max_syllables: int = 3
    seed: int = 0


class ShoutData(vf.TaskData):
    word: str


class ShoutTask(vf.Task[ShoutData, vf.State, vf.TaskConfig]):
    """One word to write in capitals."""

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return 1.0 if _reply(trace) == self.data.word.upper() else 0.0

    @vf.reward(weight=0.5)
    async def shouted(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.word.upper() in trace.last_reply else 0.0

    @vf.reward(weight=0.25)
    async def capitals(self, trace: vf.Trace) -> float:
        letters = [character for character in trace.last_reply if character.isalpha()]
        return sum(character.isupper() for character in letters) / len(letters) if letters else 0.0

    @vf.reward(weight=0.0)
    async def terse(self, trace: vf.Trace) -> float:
        return 1.0 if _WORD.fullmatch(_reply(trace)) else 0.0


class ShoutTaskset(vf.Taskset[ShoutTask, ShoutConfig]):
    """Write a made-up word in capital letters, and nothing else; 1 for exactly the word in capitals."""

    def load(self):
        config = self.config
        if not 1 <= config.min_syllables <= config.max_syllables <= 6:
            raise ValueError("shout-word needs 1 <= min_syllables <= max_syllables <= 6")
        rng = random.Random(config.seed)
        for _ in range(config.num_tasks):
            syllables = rng.randint(config.min_syllables, config.max_syllables)
            word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))
            yield ShoutTask(
                ShoutData(
                    prompt=f"Write the word '{word}' in capital letters.",
                    system_prompt="Reply with the word only.",
                    word=word,
                ),
                self.config.task,
            )


__all__ = ["ShoutTaskset"]
