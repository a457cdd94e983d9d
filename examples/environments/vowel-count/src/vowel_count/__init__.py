"""`vowel-count`: how many vowels (a, e, i, o, u) are in a short made-up word?

An environment of Lab's own protocol (``lab_environments.Environment``, from the
``lab-environments`` distribution this package depends on), declared by the
``lab.environments`` entry point in pyproject.toml. Words are drawn from a seeded generator, so
nothing is downloaded and every run sees the same examples for the same seed. The reward is the
rubric's weighted sum: ``exact`` (weight 1) counts, ``close`` (weight 0) is reported only.
"""

from __future__ import annotations

import random
import re

from lab_environments import Environment, EnvironmentInfo, Example, InvalidEnvironment, RewardFunction

VOWELS = "aeiou"
CONSONANTS = "bcdfghjklmnpqrstvwxyz"
_INTEGER = re.compile(r"\d+")


def _exact(completion: str, example: Example) -> float:
    """1 when the first integer of the reply is the vowel count."""
    found = _INTEGER.search(completion)
    return 1.0 if found and found.group() == example.answer else 0.0


def _close(completion: str, example: Example) -> float:
    """1 - |guess - count| / 4, at least 0: partial credit for a near miss (weight 0: reported only)."""
    found = _INTEGER.search(completion)
    if not found:
        return 0.0
    return max(0.0, 1.0 - abs(int(found.group()) - int(example.answer)) / 4)


class VowelCount(Environment):
    """Prompts "How many vowels are in 'kabo'?"; reward 1 for the exact count."""

    info = EnvironmentInfo(
        id="vowel-count",  # Lab replaces the id with the pushed one (<organization>/vowel-count@<version>)
        name="vowel-count",
        description="Count the vowels of a short made-up word.",
        args={"min_length": 3, "max_length": 6},
    )
    rubric = (RewardFunction("exact", 1.0, _exact), RewardFunction("close", 0.0, _close))

    def check_args(self) -> None:
        if not 1 <= self.args["min_length"] <= self.args["max_length"] <= 20:
            raise InvalidEnvironment("vowel-count needs 1 <= min_length <= max_length <= 20")

    def make_example(self, rng: random.Random) -> Example:
        length = rng.randint(self.args["min_length"], self.args["max_length"])
        word = "".join(rng.choice(VOWELS if rng.random() < 0.4 else CONSONANTS) for _ in range(length))
        count = sum(letter in VOWELS for letter in word)
        return Example(
            messages=[
                {"role": "system", "content": "Answer with a number only."},
                {"role": "user", "content": f"How many vowels are in '{word}'?"},
            ],
            answer=str(count),
            info={"word": word},
        )
