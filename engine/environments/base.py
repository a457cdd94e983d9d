"""The environment protocol: procedural datasets of chat prompts with answers, scored by a rubric.

The protocol is small on purpose, so that an adapter for verifiers tasksets or a user's
uploaded environment package fits later: an environment turns (seed, split, index) into an
`Example` and scores a completion with weighted reward functions. The reward of a rollout is
the weighted sum of its functions' scores; every function's score is also reported as the
metric `reward/<env>/<function>/mean` (docs/api.md), weight 0 included.

Splits: every environment has three disjoint splits, "train", "eval" and "val" (validation,
`[val]`). A procedural environment draws each example from its split's own seeded stream and
keeps a draw only when the prompt belongs to that split: the SHA-256 of the prompt's messages
(canonical JSON), taken modulo `SPLIT_BUCKETS`, is `EVAL_BUCKET` for eval, `VAL_BUCKET` for
val and anything else for train (so 1/16 of the prompts are eval's, 1/16 val's). The same
prompt is therefore never in two splits. `eval_size` declares how many examples an eval of
`num_examples = -1` (the whole split) takes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Callable

from engine.catalog import EnvironmentInfo

logger = logging.getLogger("engine")

SPLITS = ("train", "eval", "val")
SPLIT_BUCKETS = 16
EVAL_BUCKET = 0
VAL_BUCKET = 1
#: Draws tried for one example before an environment counts as too small to split.
MAX_SPLIT_DRAWS = 256


class InvalidEnvironment(ValueError):
    """An environment id is not installed or its args are invalid."""


class EnvironmentFailed(Exception):
    """An environment's own code failed while the job ran (a taskset's reward function or task
    source raised): the job's fault, which a restart of the attempt would repeat. The rollout is
    run again up to `[[env]] retries` times (`Environment.score_rollout`, engine/multi_turn.py);
    past them the engine exits 2 (`environment_error`) instead of crashing."""


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
    """The weighted reward of one completion and each function's raw score; `timed_out`: the
    scoring ran past the `[[env]] timeout` and was cancelled (reward 0, every function 0)."""

    reward: float
    functions: dict[str, float]
    timed_out: bool = False
    #: Why it timed out (the environment's words), when it did.
    message: str = ""


class Environment:
    """A seeded procedural task. Subclasses set `info` and `rubric` and write `make_example`."""

    info: EnvironmentInfo
    rubric: tuple[RewardFunction, ...] = ()
    #: Examples in the eval split: what an eval of ``num_examples = -1`` takes. A procedural
    #: environment has no natural end, so it declares a size; subclasses may change it.
    eval_size: int = 128
    #: Whether episodes take several turns (a verifiers package's own Env, engine/multi_turn.py);
    #: such an environment runs episodes instead of scoring one completion.
    multi_turn: bool = False
    #: The job's caps on a multi-turn episode's agents (`[[env]]` max_turns, max_input_tokens,
    #: max_output_tokens; None where a block leaves one out), set by the orchestrator.
    limits: dict | None = None
    #: Times a rollout whose environment code failed (EnvironmentFailed) is run again before the
    #: failure ends the job (`[[env]]` retries, or max_retries), set by the orchestrator.
    retries: int = 0
    #: Seconds the environment's part of a rollout may take (`[[env]]` timeout; None: no limit),
    #: set by the orchestrator: a verifiers multi-turn episode's deadline, a verifiers taskset's
    #: scoring. Lab's own environments score in the engine and ignore it.
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
        """Raise InvalidEnvironment when the merged args are out of range (subclasses add checks)."""

    def example(self, index: int, split: str = "train") -> Example:
        """Return example `index` of `split` ("train", "eval" or "val"); the same for the same seed.

        Draw k of example `index` is made by `random.Random` seeded with
        "<id>:<seed>:<split>:<index>" (":<k>" appended from the second draw on), which is
        stable across processes (it hashes with SHA-512), so examples do not depend on
        PYTHONHASHSEED. The first draw whose prompt belongs to `split` (`split_of`) is kept.
        An environment with so few distinct prompts that none of `MAX_SPLIT_DRAWS` draws
        lands in the split keeps its first draw (the splits then overlap) and logs a warning
        once per split. Raises ValueError for another split name.
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
        raise NotImplementedError

    def score(self, completion: str, example: Example) -> Scores:
        """Score a completion (decoded text, special tokens removed) against its example."""
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
    """Whether a rollout of `env` that failed with `error` after `retried` retries is run again
    (`env.retries`, `[[env]] retries`); logs the retry, naming `what` failed (`outcome`:
    "timed out" for a rollout past its `[[env]] timeout`, which verifiers' retries run again too)."""
    if retried >= env.retries:
        return False
    logger.warning("%s %s (%s); running it again, retry %d of %d", what, outcome, error, retried + 1, env.retries)
    return True


def split_of(example: Example) -> str:
    """Return the split ("train", "eval" or "val") that the prompt of `example` belongs to:
    SHA-256 of its messages as canonical JSON (sorted keys, no spaces), modulo SPLIT_BUCKETS."""
    digest = hashlib.sha256(json.dumps(example.messages, sort_keys=True, separators=(",", ":")).encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % SPLIT_BUCKETS
    return "eval" if bucket == EVAL_BUCKET else "val" if bucket == VAL_BUCKET else "train"
