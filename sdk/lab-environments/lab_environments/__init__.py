"""Lab's environment protocol: what an environment package of Lab's own kind implements.

An environment is a seeded source of tasks: it turns ``(seed, split, index)`` into an `Example`
(the chat messages of a prompt and the answer its rubric checks) and scores a completion, the
model's reply as text, with weighted reward functions. A package declares its `Environment`
subclass as the one entry point of the ``lab.environments`` group in its pyproject.toml::

    [project]
    dependencies = ["lab-environments>=0.1,<0.2"]

    [project.entry-points."lab.environments"]
    my-env = "my_env:MyEnv"

This distribution holds the standard library only. Lab's engine imports the same classes, so a
package that depends on it runs unchanged in a job; `lab envs try` loads a package as a job
would, before it is pushed.

Splits: every environment has three disjoint splits, "train", "eval" and "val" (validation).
`Environment.example` draws each example from its split's own seeded stream and keeps a draw
only when its prompt belongs to that split (`split_of`: the SHA-256 of the prompt's messages as
canonical JSON, modulo `SPLIT_BUCKETS`, is `EVAL_BUCKET` for eval, `VAL_BUCKET` for val and
anything else for train), so the same prompt is never in two splits: 1/16 of the prompts are
eval's, 1/16 val's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

__version__ = "0.1.0"

__all__ = [
    "EVAL_BUCKET", "MAX_SPLIT_DRAWS", "SPLITS", "SPLIT_BUCKETS", "VAL_BUCKET", "Environment", "EnvironmentFailed",
    "EnvironmentInfo", "Example", "InvalidEnvironment", "RewardFunction", "Scores", "retry_allowed", "split_of",
]

logger = logging.getLogger("lab_environments")

#: The split names, in the order Lab reports them.
SPLITS = ("train", "eval", "val")
SPLIT_BUCKETS = 16
EVAL_BUCKET = 0
VAL_BUCKET = 1
#: Draws tried for one example before an environment counts as too small to split.
MAX_SPLIT_DRAWS = 256


class InvalidEnvironment(ValueError):
    """An environment id is not installed, or its arguments are invalid.

    Raise it from `Environment.check_args` for arguments of the right type but out of range; a
    job then fails before its first step (exit 2, ``environment_error``) with its message.
    """


class EnvironmentFailed(Exception):
    """An environment's own code failed while the job ran (a reward function or a task source
    raised): the job's fault, which a restart of the attempt would repeat. The rollout is run
    again up to ``[[env]] retries`` times (`Environment.score_rollout`); past them the job fails
    with exit 2 (``environment_error``) instead of crashing."""


@dataclass(frozen=True)
class EnvironmentInfo:
    """What an environment is called, says and takes.

    - ``id``: the environment's id. Lab replaces it with the pushed id
      (``<organization>/<name>@<version>``), so a package writes its own name here.
    - ``name``: the id without owner or version (``"vowel-count"``), used in metric names
      (``reward/<name>/mean``); Lab sets it to the package's name.
    - ``description``: one line for ``lab envs`` and the Environments page; empty takes the
      wheel's ``Summary``.
    - ``args``: the default arguments, ``{name: JSON value}``. A job's ``[[env]] args`` may only
      use these keys, each with a value of its default's JSON type (an integer where the
      default is a float; anything where it is None); Lab checks that at submit, and
      `Environment.check_args` checks ranges.
    """

    id: str
    name: str
    description: str
    args: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Example:
    """One task.

    - ``messages``: the prompt as chat messages, ``[{"role": "system"|"user"|"assistant",
      "content": str}, ...]``, which the policy's chat template renders; the split a prompt
      belongs to is a hash of these.
    - ``answer``: what the rubric checks the reply against (text; the model never sees it).
    - ``info``: anything else the rubric needs (a JSON object: Lab may store it with a sample).
    """

    messages: list[dict]
    answer: str
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RewardFunction:
    """One named score of a reply and its weight in the reward.

    ``score(completion, example)`` takes the reply (decoded text, special tokens removed) and the
    `Example` it answers, and returns a float, conventionally in [0, 1] (Lab does not clamp it).
    The rollout's reward is the weighted sum over the rubric, so with weights that add up to
    more than 1 it can exceed 1. A weight of 0 keeps a function out of the reward: it is only
    reported, like every function, as the metric ``reward/<name>/<function>/mean``.
    """

    name: str
    weight: float
    score: Callable[[str, Example], float]


@dataclass(frozen=True)
class Scores:
    """The reward of one reply and each function's raw score.

    ``reward`` is the weighted sum of ``functions`` (name to score); ``timed_out`` says the
    scoring ran past the ``[[env]] timeout`` and was cancelled (reward 0, every function 0), and
    ``message`` why, in the environment's words.
    """

    reward: float
    functions: dict[str, float]
    timed_out: bool = False
    message: str = ""


class Environment:
    """A seeded procedural task. A subclass sets `info` and `rubric` and writes `make_example`
    (or `example` itself); `check_args` and `score` are optional.

    Lab constructs it as ``MyEnv(args, seed)``: ``args`` the job's ``[[env]] args`` (already
    checked against ``info.args``' keys and types), ``seed`` the job's seed. ``self.args`` is
    then ``info.args`` updated with ``args``. A subclass that writes its own ``__init__`` calls
    ``super().__init__(args, seed)``.
    """

    #: Required: the environment's id, name, description and default arguments.
    info: EnvironmentInfo
    #: The weighted reward functions; the reward is their weighted sum (`score`).
    rubric: tuple[RewardFunction, ...] = ()
    #: Examples in the eval split: what an eval of ``num_examples = -1`` takes. A procedural
    #: environment has no natural end, so it declares a size.
    eval_size: int = 128
    # Set by Lab's engine, never by a package: whether episodes take several turns (a verifiers
    # package's own Env), the job's caps on a multi-turn episode (``[[env]]`` max_turns,
    # max_input_tokens, max_output_tokens), the retries of a rollout whose environment code
    # failed (``[[env]] retries``) and the seconds its scoring may take (``[[env]] timeout``).
    multi_turn: bool = False
    limits: dict | None = None
    retries: int = 0
    timeout: float | None = None

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
        """Raise InvalidEnvironment when ``self.args`` are out of range. Optional: the default
        accepts every value of the right type."""

    def example(self, index: int, split: str = "train") -> Example:
        """Return example ``index`` (0, 1, 2, ...) of ``split`` ("train", "eval" or "val"); the
        same for the same seed, in any process.

        Draw k of example ``index`` is made by `make_example` with a ``random.Random`` seeded
        with "<id>:<seed>:<split>:<index>" (":<k>" appended from the second draw on; a string
        seed hashes with SHA-512, so examples do not depend on PYTHONHASHSEED). The first draw
        whose prompt belongs to ``split`` (`split_of`) is kept. An environment with so few
        distinct prompts that none of `MAX_SPLIT_DRAWS` draws lands in the split keeps its first
        draw (the splits then overlap) and logs a warning once per split. Raises ValueError for
        another split name. Override it to read a fixed dataset instead (splits are then yours).
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        first = None
        unsplittable = self.__dict__.setdefault("_unsplittable", set())  # subclasses may skip __init__
        if split not in unsplittable:
            for draw in range(MAX_SPLIT_DRAWS):
                suffix = f":{draw}" if draw else ""
                example = self.make_example(random.Random(f"{self.id}:{self.seed}:{split}:{index}{suffix}"))
                if split_of(example) == split:
                    return example
                first = first or example
            unsplittable.add(split)
            logger.warning(
                "%s: no prompt of %d draws belongs to its %s split (too few distinct prompts); "
                "its %s examples may repeat other splits' prompts", self.id, MAX_SPLIT_DRAWS, split, split,
            )
        return first or self.make_example(random.Random(f"{self.id}:{self.seed}:{split}:{index}"))

    def make_example(self, rng: random.Random) -> Example:
        """Draw one example with ``rng`` (and ``self.args``); only ``rng`` may be random."""
        raise NotImplementedError(f"{type(self).__name__} writes neither make_example nor example")

    def score(self, completion: str, example: Example) -> Scores:
        """Score a reply (decoded text, special tokens removed) against its example: each rubric
        function's score, and their weighted sum as the reward."""
        functions = {f.name: float(f.score(completion, example)) for f in self.rubric}
        reward = sum(f.weight * functions[f.name] for f in self.rubric)
        return Scores(reward=reward, functions=functions)

    def score_rollout(self, completion: str, example: Example) -> Scores:
        """`score`, run again while the environment's code fails or its scoring runs past the
        timeout, at most `retries` more times (each retry is logged); raises the last
        EnvironmentFailed when every try failed, and returns the last timed-out Scores when
        every try timed out (a timeout is the rollout's outcome, not the job's failure)."""
        tries = 0
        while True:
            try:
                scores = self.score(completion, example)
            except EnvironmentFailed as error:
                if not retry_allowed(self, tries, error, "scoring"):
                    raise
                tries += 1
                continue
            if not scores.timed_out or not retry_allowed(self, tries, scores.message, "scoring", outcome="timed out"):
                return scores
            tries += 1


def retry_allowed(env: Environment, retried: int, error: Exception | str, what: str, *, outcome: str = "failed") -> bool:
    """Whether a rollout of ``env`` that failed with ``error`` after ``retried`` retries is run
    again (``env.retries``); logs the retry, naming ``what`` failed (``outcome``: "timed out"
    for a rollout past its ``[[env]] timeout``)."""
    if retried >= env.retries:
        return False
    logger.warning("%s %s (%s); running it again, retry %d of %d", what, outcome, error, retried + 1, env.retries)
    return True


def split_of(example: Example) -> str:
    """Return the split ("train", "eval" or "val") the prompt of ``example`` belongs to: the
    SHA-256 of its messages as canonical JSON (sorted keys, no spaces), modulo SPLIT_BUCKETS."""
    digest = hashlib.sha256(json.dumps(example.messages, sort_keys=True, separators=(",", ":")).encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % SPLIT_BUCKETS
    return "eval" if bucket == EVAL_BUCKET else "val" if bucket == VAL_BUCKET else "train"
