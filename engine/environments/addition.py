"""`lab/addition`: add a few small non-negative integers."""

from __future__ import annotations

import random
import re

from engine.catalog import list_environments
from engine.environments.base import Environment, Example, InvalidEnvironment, RewardFunction

_INTEGER = re.compile(r"-?\d+")


def _last_integer_is_answer(completion: str, example: Example) -> float:
    """1 when the last integer in the completion is the sum (the usual "final answer" rule)."""
    integers = _INTEGER.findall(completion)
    return 1.0 if integers and integers[-1] == example.answer else 0.0


def _answer_only(completion: str, example: Example) -> float:
    """1 when the completion is the sum and nothing else (whitespace and a final period allowed)."""
    return 1.0 if completion.strip().rstrip(".").strip() == example.answer else 0.0


class Addition(Environment):
    """Prompts "What is a + b?"; reward 1 when the final integer of the reply is the sum."""

    info = list_environments()["lab/addition"]
    rubric = (
        RewardFunction("correct", 1.0, _last_integer_is_answer),
        RewardFunction("answer_only", 0.0, _answer_only),
    )

    def check_args(self) -> None:
        low, high, count = self.args["min_operand"], self.args["max_operand"], self.args["num_operands"]
        if not 0 <= low <= high or not 2 <= count <= 8:
            raise InvalidEnvironment(
                "lab/addition needs 0 <= min_operand <= max_operand and 2 <= num_operands <= 8"
            )

    def make_example(self, rng: random.Random) -> Example:
        operands = [
            rng.randint(self.args["min_operand"], self.args["max_operand"])
            for _ in range(self.args["num_operands"])
        ]
        question = " + ".join(str(n) for n in operands)
        return Example(
            messages=[
                {"role": "system", "content": "You are a calculator. Reply with the result only."},
                {"role": "user", "content": f"What is {question}?"},
            ],
            answer=str(sum(operands)),
            info={"operands": operands},
        )
