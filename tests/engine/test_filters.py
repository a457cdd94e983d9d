"""Rollout filters (engine.filters) and the spec's filter settings and defaults."""

import math

import pytest
import torch

from engine.filters import (
    Rollouts,
    apply_filters,
    filter_flags,
    filter_metrics,
    is_gibberish,
    most_repeated_ngram_count,
    nonprintable_fraction,
)
from engine.grpo import group_advantages
from labsdk.spec import SpecError, parse_spec


def spec_with(**keys):
    return parse_spec({"model": "lab/tiny-random-llama", "env": [{"id": "lab/addition"}], **keys}).spec


def rollouts(rewards, *, group_size=2, token_ids=None, logprobs=None, texts=None):
    count = len(rewards)
    return Rollouts(
        rewards=rewards, token_ids=token_ids or [[1, 2, 3]] * count, logprobs=logprobs or [[-0.5] * 3] * count,
        texts=texts or ["ok"] * count, group_size=group_size,
    )


def test_it_flags_every_rollout_of_a_group_with_equal_rewards():
    batch = rollouts([1.0, 1.0, 0.0, 1.0, 0.5, 0.5 + 1e-9])
    assert filter_flags("zero_advantage", {"tolerance": 1e-6}, batch, [True] * 6) == [True, True, False, False, True, True]


def test_it_compares_only_the_rollouts_still_kept_for_zero_advantage():
    batch = rollouts([1.0, 0.0, 0.0, 1.0, 0.0], group_size=5)
    # With the 1.0s dropped, the kept rewards of the group are all 0: the kept rows are flagged.
    assert filter_flags("zero_advantage", {"tolerance": 1e-6}, batch, [False, True, True, False, True]) == [
        False, True, True, False, True,
    ]


def test_it_measures_gibberish_by_mean_logprob_and_nonprintable_text():
    assert nonprintable_fraction("") == 0.0
    assert nonprintable_fraction("ab\ncd\t") == 0.0
    assert nonprintable_fraction("a\x00\x01\ufffd") == 0.75
    settings = {"min_mean_logprob": -6.0, "max_nonprintable_fraction": 0.5}
    assert not is_gibberish("fine", [-5.0, -7.0], **settings)  # mean -6.0 is not below -6.0
    assert is_gibberish("fine", [-5.0, -7.5], **settings)
    assert not is_gibberish("fine", [], **settings)  # greedy: no log-probabilities, the text decides
    assert is_gibberish("\x00\x00\x00a", [], **settings)
    assert not is_gibberish("\x00a", [], **settings)  # exactly half is not more than half


def test_it_counts_the_most_repeated_ngram_with_overlaps():
    assert most_repeated_ngram_count([7, 7, 7, 7, 7], 2) == 4
    assert most_repeated_ngram_count([1, 2, 1, 2, 1, 2], 2) == 3
    assert most_repeated_ngram_count([1, 2], 3) == 0
    batch = rollouts([0.0, 1.0], token_ids=[[5] * 12, [1, 2, 3, 4, 5, 6]])
    # [5]*12 holds the 4-gram (5,5,5,5) 9 times: more than the default 8.
    assert filter_flags("repetition", {"ngram_size": 4, "max_repeats": 8}, batch, [True, True]) == [True, False]
    assert filter_flags("repetition", {"ngram_size": 4, "max_repeats": 9}, batch, [True, True]) == [False, False]


class Filter:
    def __init__(self, type, enforced=True, **settings):
        self.type, self.enforced, self._settings = type, enforced, settings

    def settings(self):
        return self._settings


def test_enforced_filters_drop_and_unenforced_ones_only_count():
    batch = rollouts([1.0, 1.0, 0.0, 1.0], token_ids=[[1, 2], [3, 3, 3, 3], [1, 2], [1, 2]])
    keep, flagged = apply_filters(
        [Filter("zero_advantage", tolerance=1e-6), Filter("repetition", enforced=False, ngram_size=1, max_repeats=3)],
        batch, [True] * 4,
    )
    # Group 0 (rewards 1, 1) is dropped; row 1 was already dropped, so repetition flags nothing.
    assert keep == [False, False, True, True]
    assert flagged == {"zero_advantage": {0, 1}, "repetition": set()}
    assert filter_metrics(flagged, 4) == {"filter/zero_advantage/fraction": 0.5, "filter/repetition/fraction": 0.0}
    keep, flagged = apply_filters([Filter("repetition", enforced=False, ngram_size=1, max_repeats=3)], batch, [True] * 4)
    assert keep == [True] * 4 and flagged == {"repetition": {1}}


def test_advantages_are_taken_over_the_kept_rollouts_of_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 2.0, 2.0, 2.0, 9.0])
    keep = torch.tensor([True, True, True, False, True, True, True, False])
    advantages = group_advantages(rewards, 4, keep=keep)
    # Group 0 keeps (1, 0, 0): mean 1/3, population std sqrt(2)/3.
    mean, std = 1 / 3, math.sqrt(2) / 3
    expected = [(1 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4), 0.0]
    assert advantages[:4].tolist() == pytest.approx(expected, rel=1e-6)
    # Group 1 keeps (2, 2, 2): equal rewards, no signal; the dropped 9.0 does not count.
    assert advantages[4:].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert group_advantages(rewards, 4).tolist() == pytest.approx(
        group_advantages(rewards, 4, keep=torch.ones(8, dtype=torch.bool)).tolist()
    )


def test_the_spec_defaults_to_one_zero_advantage_filter_before_advantages():
    spec = spec_with()
    assert [(f.type, f.enforced, f.settings()) for f in spec.batch_filters("pre_batch_filters")] == [
        ("zero_advantage", True, {"tolerance": 1e-6}),
    ]
    assert spec.batch_filters("post_batch_filters") == []
    assert spec_with(pre_batch_filters=[]).batch_filters("pre_batch_filters") == []
    assert spec_with(post_batch_filters=[{"type": "gibberish"}]).batch_filters("pre_batch_filters")[0].type == "zero_advantage"


def test_the_spec_fills_in_filter_settings_and_checks_them():
    spec = spec_with(post_batch_filters=[
        {"type": "gibberish", "enforce": False, "min_mean_logprob": -3},
        {"type": "repetition", "max_repeats": 2, "window": 5},
    ])
    gibberish, repetition = spec.batch_filters("post_batch_filters")
    assert (gibberish.enforced, gibberish.settings()) == (False, {"min_mean_logprob": -3, "max_nonprintable_fraction": 0.5})
    assert repetition.settings() == {"ngram_size": 4, "max_repeats": 2}
    assert repetition.unknown_settings() == ["window"]
    for bad, param in [
        ({"type": "repetition", "ngram_size": 0}, "pre_batch_filters.0.ngram_size"),
        ({"type": "repetition", "max_repeats": 2.5}, "pre_batch_filters.0.max_repeats"),
        ({"type": "gibberish", "min_mean_logprob": 1.0}, "pre_batch_filters.0.min_mean_logprob"),
        ({"type": "gibberish", "max_nonprintable_fraction": True}, "pre_batch_filters.0.max_nonprintable_fraction"),
    ]:
        with pytest.raises(SpecError) as caught:
            spec_with(pre_batch_filters=[bad])
        assert caught.value.param == param


def test_zero_advantage_takes_groups_of_different_sizes_each_as_a_whole():
    # groups of 2, 3 and 1: the first and the single one are all equal, the middle one is not
    batch = rollouts([0.5, 0.5, 1.0, 0.0, 1.0, 0.25], group_size=[2, 3, 1])
    assert filter_flags("zero_advantage", {"tolerance": 1e-6}, batch, [True] * 6) == [True, True, False, False, False, True]
