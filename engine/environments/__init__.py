"""Environments: procedural datasets of chat prompts with answers, scored by a rubric.

The protocol is small on purpose, so that an adapter for verifiers tasksets or a user's
uploaded environment package fits later: an environment turns (seed, split, index) into an
`Example` and scores a completion with weighted reward functions. The reward of a rollout is
the weighted sum of its functions' scores; every function's score is also reported as the
metric `reward/<env>/<function>/mean` (docs/api.md), weight 0 included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from engine.catalog import EnvironmentInfo, list_environments


class InvalidEnvironment(ValueError):
    """An environment id is not installed or its args are invalid."""


@dataclass(frozen=True)
class Example:
    """One task: chat `messages` for the prompt and the `answer` the rubric checks against."""

    messages: list[dict]
    answer: str
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RewardFunction:
    """A named score in [0, 1] of (completion text, example), and its weight in the reward."""

    name: str
    weight: float
    score: Callable[[str, Example], float]


@dataclass(frozen=True)
class Scores:
    """The weighted reward of one completion and each function's raw score."""

    reward: float
    functions: dict[str, float]


class Environment:
    """A seeded procedural task. Subclasses set `info` and `rubric` and write `make_example`."""

    info: EnvironmentInfo
    rubric: tuple[RewardFunction, ...] = ()

    def __init__(self, args: dict, seed: int):
        self.args = {**self.info.args, **args}
        self.seed = seed
        self.check_args()

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str:
        return self.info.name

    def check_args(self) -> None:
        """Raise InvalidEnvironment when the merged args are out of range (subclasses add checks)."""

    def example(self, index: int, split: str = "train") -> Example:
        """Return example `index` of `split` ("train" or "eval"); the same for the same seed.

        `random.Random` seeded with a string is stable across processes (it hashes with
        SHA-512), so examples do not depend on PYTHONHASHSEED.
        """
        return self.make_example(random.Random(f"{self.id}:{self.seed}:{split}:{index}"))

    def make_example(self, rng: random.Random) -> Example:
        raise NotImplementedError

    def score(self, completion: str, example: Example) -> Scores:
        """Score a completion (decoded text, special tokens removed) against its example."""
        functions = {f.name: float(f.score(completion, example)) for f in self.rubric}
        reward = sum(f.weight * functions[f.name] for f in self.rubric)
        return Scores(reward=reward, functions=functions)


def _registry() -> dict[str, type[Environment]]:
    from engine.environments.addition import Addition
    from engine.environments.alphabet_sort import AlphabetSort
    from engine.environments.reverse_text import ReverseText

    return {cls.info.id: cls for cls in (Addition, ReverseText, AlphabetSort)}


def check_args(info: EnvironmentInfo, args: dict) -> None:
    """Raise InvalidEnvironment unless every key of `args` is a default's key of the same JSON type."""
    for key, value in args.items():
        if key not in info.args:
            raise InvalidEnvironment(
                f"{info.id} has no argument {key!r} (allowed: {', '.join(sorted(info.args))})"
            )
        default = info.args[key]
        same_type = type(value) is type(default) or (
            isinstance(default, float) and type(value) is int
        )
        if not same_type:
            raise InvalidEnvironment(
                f"{info.id} argument {key!r} must be of type {type(default).__name__}, not {value!r}"
            )


def load_environment(env_id: str, args: dict | None = None, seed: int = 0) -> Environment:
    """Instantiate an installed environment by id with the job's args and seed.

    Raises InvalidEnvironment for an id that is not installed or invalid args.
    """
    from engine.packages import installed_environment

    cls = _registry().get(env_id) or installed_environment(env_id)
    if cls is None:
        installed = ", ".join(sorted(list_environments()))
        raise InvalidEnvironment(f"environment {env_id!r} is not installed (installed: {installed})")
    check_args(cls.info, dict(args or {}))
    return cls(dict(args or {}), seed)
