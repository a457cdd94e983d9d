"""Rollout filters: `[[pre_batch_filters]]` and `[[post_batch_filters]]` of the job spec.

A filter flags rollouts of a step's batch; an enforced filter (`enforce` true or left out)
drops them from training, one that is not (`enforce = false`) only counts them. Pre-batch
filters run on the scored rollouts before advantages are computed (a group's advantages are
then taken over its rollouts that are left); post-batch filters run on the batch with its
advantages. A dropped rollout is out of the loss, but its tokens still count in the
denominator of the token-level average (every sampled completion token of the batch, a
multi-turn rollout's environment tokens never: a step with
little signal takes a small step); the step's reward metrics and samples still describe every
sampled rollout. Each step reports
`filter/<type>/fraction`: the share of the batch's rollouts that filters of that type
flagged (enforced or not).

The types (their settings and defaults are `labsdk.spec.model.FILTER_SETTINGS`, docs/spec.md):

- `zero_advantage`: every rollout of a group whose rewards (of the rollouts still kept) all
  lie within `tolerance` of each other: such a group's advantages are all 0, so it carries no
  signal, and dropping it leaves the loss to the groups that do (DAPO's dynamic sampling,
  Yu et al. 2025, §3.2, drops the same groups). Lab's default pre-batch filter.
- `gibberish`: a completion whose mean sampled-token log-probability (nats, under the
  sampling distribution; `Completion.logprobs`) is below `min_mean_logprob`, or whose decoded
  text has more than `max_nonprintable_fraction` of non-printable characters (Unicode
  categories that `str.isprintable` refuses, newline and tab aside, and U+FFFD, which decoding
  leaves for invalid bytes). Greedy sampling (temperature 0) records no log-probabilities, so
  only the text test applies there.
- `repetition`: a completion in which some run of `ngram_size` consecutive token ids occurs
  more than `max_repeats` times (overlapping occurrences count).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from engine.groups import group_sizes_list, group_starts

#: Characters that count as printable although `str.isprintable` refuses them.
_PRINTABLE_WHITESPACE = frozenset("\n\t\r")
_REPLACEMENT_CHARACTER = "\ufffd"


class FilterSpec(Protocol):
    """What a filter needs of the spec's `BatchFilterConfig`."""

    type: str

    @property
    def enforced(self) -> bool: ...

    def settings(self) -> dict[str, float | int]: ...


@dataclass(frozen=True)
class Rollouts:
    """The rollouts of one step, row by row, groups contiguous.

    `rewards`: float per rollout; `token_ids` and `logprobs`: the sampled tokens and their
    log-probabilities (nats; empty when greedy); `texts`: the decoded completions;
    `group_size`: rollouts per example, one number for every group or one per group
    (`[[env]] group_size`, engine/groups.py).
    """

    rewards: Sequence[float]
    token_ids: Sequence[Sequence[int]]
    logprobs: Sequence[Sequence[float]]
    texts: Sequence[str]
    group_size: int | Sequence[int]


def zero_advantage_flags(rollouts: Rollouts, keep: Sequence[bool], *, tolerance: float) -> list[bool]:
    """Flag every kept rollout of a group whose kept rewards span less than `tolerance`."""
    flags = [False] * len(rollouts.rewards)
    starts = group_starts(group_sizes_list(rollouts.group_size, len(rollouts.rewards)))
    for start, end in zip(starts, starts[1:]):
        rows = [row for row in range(start, end) if keep[row]]
        rewards = [rollouts.rewards[row] for row in rows]
        if rewards and max(rewards) - min(rewards) < tolerance:
            for row in rows:
                flags[row] = True
    return flags


def nonprintable_fraction(text: str) -> float:
    """Return the share of `text`'s characters that are not printable (0.0 for empty text)."""
    if not text:
        return 0.0
    bad = sum(
        1 for character in text
        if character == _REPLACEMENT_CHARACTER or not (character.isprintable() or character in _PRINTABLE_WHITESPACE)
    )
    return bad / len(text)


def is_gibberish(text: str, logprobs: Sequence[float], *, min_mean_logprob: float, max_nonprintable_fraction: float) -> bool:
    """Whether one completion is gibberish by the two tests of the module docstring."""
    if logprobs and sum(logprobs) / len(logprobs) < min_mean_logprob:
        return True
    return nonprintable_fraction(text) > max_nonprintable_fraction


def most_repeated_ngram_count(token_ids: Sequence[int], ngram_size: int) -> int:
    """Return how often the most frequent run of `ngram_size` token ids occurs (0 if none fits)."""
    if len(token_ids) < ngram_size:
        return 0
    counts = Counter(tuple(token_ids[i:i + ngram_size]) for i in range(len(token_ids) - ngram_size + 1))
    return max(counts.values())


def filter_flags(filter_type: str, settings: dict, rollouts: Rollouts, keep: Sequence[bool]) -> list[bool]:
    """Return, per rollout, whether a filter of `filter_type` with `settings` flags it; rollouts
    already dropped (`keep` false) are never flagged. Raises ValueError for an unknown type."""
    if filter_type == "zero_advantage":
        return zero_advantage_flags(rollouts, keep, tolerance=float(settings["tolerance"]))
    if filter_type == "gibberish":
        return [
            bool(keep[row]) and is_gibberish(
                rollouts.texts[row], rollouts.logprobs[row],
                min_mean_logprob=float(settings["min_mean_logprob"]),
                max_nonprintable_fraction=float(settings["max_nonprintable_fraction"]),
            )
            for row in range(len(rollouts.rewards))
        ]
    if filter_type == "repetition":
        return [
            bool(keep[row]) and most_repeated_ngram_count(rollouts.token_ids[row], int(settings["ngram_size"])) > int(settings["max_repeats"])
            for row in range(len(rollouts.rewards))
        ]
    raise ValueError(f"unknown rollout filter type {filter_type!r}")


def apply_filters(filters: Iterable[FilterSpec], rollouts: Rollouts, keep: Sequence[bool]) -> tuple[list[bool], dict[str, set[int]]]:
    """Run `filters` in order over the rollouts still kept.

    Returns the new keep mask (enforced filters' flags dropped) and, per filter type, the
    rows it flagged (a set, so two filters of one type count a rollout once).
    """
    keep = list(keep)
    flagged: dict[str, set[int]] = {}
    for spec in filters:
        flags = filter_flags(spec.type, spec.settings(), rollouts, keep)
        rows = {row for row, flag in enumerate(flags) if flag}
        flagged.setdefault(spec.type, set()).update(rows)
        if spec.enforced:
            for row in rows:
                keep[row] = False
    return keep, flagged


def filter_metrics(flagged: dict[str, set[int]], total: int) -> dict[str, float]:
    """Return `filter/<type>/fraction` for each type that ran: flagged rows over `total` rollouts."""
    return {f"filter/{kind}/fraction": len(rows) / total if total else 0.0 for kind, rows in flagged.items()}
