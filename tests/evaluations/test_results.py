"""pass@k (evaluations.results): the unbiased estimator of Chen et al. 2021 against a count of
every draw, and the k an evaluation reports."""

from __future__ import annotations

import itertools

import pytest

from evaluations.results import k_values, pass_at_k


@pytest.mark.parametrize("n, c", [(1, 0), (1, 1), (4, 1), (5, 2), (8, 3), (6, 6)])
def test_pass_at_k_is_the_share_of_k_draws_holding_a_success(n, c):
    rollouts = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        draws = list(itertools.combinations(rollouts, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(draw) for draw in draws) / len(draws))


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_the_reported_k_are_powers_of_two_and_the_rollouts():
    assert k_values(1) == [1]
    assert k_values(2) == [1, 2]
    assert k_values(5) == [1, 2, 4, 5]
    assert k_values(16) == [1, 2, 4, 8, 16]
