"""`lab/reverse-text`: reverse a short lowercase word."""

from __future__ import annotations

import random
import string

from engine.catalog import list_environments
from engine.environments.base import Environment, Example, InvalidEnvironment, RewardFunction


def longest_common_subsequence(a: str, b: str) -> int:
    """Return the length of the longest common subsequence of two strings (O(len(a)·len(b)))."""
    previous = [0] * (len(b) + 1)
    for char_a in a:
        current = [0]
        for j, char_b in enumerate(b):
            current.append(previous[j] + 1 if char_a == char_b else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def _lcs_ratio(completion: str, example: Example) -> float:
    """2·LCS / (len(reply) + len(answer)) on the stripped reply: 1 for an exact reversal."""
    reply = completion.strip()
    total = len(reply) + len(example.answer)
    return 2.0 * longest_common_subsequence(reply, example.answer) / total if total else 0.0


def _exact(completion: str, example: Example) -> float:
    return 1.0 if completion.strip() == example.answer else 0.0


class ReverseText(Environment):
    """Prompts "Reverse the text: abc"; reward is the LCS ratio against "cba"."""

    info = list_environments()["lab/reverse-text"]
    rubric = (
        RewardFunction("lcs_ratio", 1.0, _lcs_ratio),
        RewardFunction("exact", 0.0, _exact),
    )

    def check_args(self) -> None:
        if not 1 <= self.args["min_length"] <= self.args["max_length"] <= 64:
            raise InvalidEnvironment("lab/reverse-text needs 1 <= min_length <= max_length <= 64")

    def make_example(self, rng: random.Random) -> Example:
        length = rng.randint(self.args["min_length"], self.args["max_length"])
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
        return Example(
            messages=[
                {"role": "system", "content": "Reverse the text character by character. Reply with the reversed text only."},
                {"role": "user", "content": word},
            ],
            answer=word[::-1],
        )
