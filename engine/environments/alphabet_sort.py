"""`lab/alphabet-sort`: sort a few lowercase words alphabetically."""

from __future__ import annotations

import random
import string

from engine.catalog import list_environments
from engine.environments.base import Environment, Example, InvalidEnvironment, RewardFunction


def _position_accuracy(completion: str, example: Example) -> float:
    """Fraction of the expected words found at their position in the reply (split on whitespace/commas)."""
    expected = example.answer.split(", ")
    reply = completion.replace(",", " ").split()
    hits = sum(1 for i, word in enumerate(expected) if i < len(reply) and reply[i] == word)
    return hits / len(expected)


def _exact(completion: str, example: Example) -> float:
    return 1.0 if completion.replace(",", " ").split() == example.answer.split(", ") else 0.0


class AlphabetSort(Environment):
    """Prompts a comma-separated word list; reward is the fraction of words in sorted position."""

    info = list_environments()["lab/alphabet-sort"]
    rubric = (
        RewardFunction("position_accuracy", 1.0, _position_accuracy),
        RewardFunction("exact", 0.0, _exact),
    )

    def check_args(self) -> None:
        if not 2 <= self.args["num_words"] <= 16 or not 1 <= self.args["min_length"] <= self.args["max_length"] <= 16:
            raise InvalidEnvironment(
                "lab/alphabet-sort needs 2 <= num_words <= 16 and 1 <= min_length <= max_length <= 16"
            )

    def make_example(self, rng: random.Random) -> Example:
        words = [
            "".join(
                rng.choice(string.ascii_lowercase)
                for _ in range(rng.randint(self.args["min_length"], self.args["max_length"]))
            )
            for _ in range(self.args["num_words"])
        ]
        return Example(
            messages=[
                {"role": "system", "content": "Sort the words alphabetically. Reply with the sorted words, comma-separated, and nothing else."},
                {"role": "user", "content": ", ".join(words)},
            ],
            answer=", ".join(sorted(words)),
        )
