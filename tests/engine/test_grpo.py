"""GRPO's advantages and loss against hand-computed values."""

import math

import pytest
import torch

from engine.grpo import group_advantages, grpo_loss, token_logprobs_and_entropy


def test_it_normalizes_rewards_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    advantages = group_advantages(rewards, group_size=4)
    # group 1: mean 0.25, population std sqrt(0.25 * 0.75); group 2: mean 0.5, std 0.5
    std_1 = math.sqrt(0.25 * 0.75)
    expected = [0.75 / (std_1 + 1e-4)] + [-0.25 / (std_1 + 1e-4)] * 3 + [0.5 / 0.5001] * 2 + [-0.5 / 0.5001] * 2
    assert advantages.tolist() == pytest.approx(expected, rel=1e-6)


def test_it_gives_groups_with_equal_rewards_zero_advantage():
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    advantages = group_advantages(rewards, group_size=4)
    assert advantages[:8].tolist() == [0.0] * 8
    assert advantages[8:].abs().sum() > 0


def test_it_refuses_rewards_that_do_not_fill_whole_groups():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(6), group_size=4)


def test_it_computes_the_clipped_token_level_loss_of_a_small_example():
    # Row 0 (A = +1): ratios 1.0 and 1.5; row 1 (A = -1): ratios 0.5 and (masked) 1.1.
    sampling = torch.log(torch.tensor([[0.2, 0.2], [0.4, 0.5]]))
    current = torch.log(torch.tensor([[0.2, 0.3], [0.2, 0.55]])).requires_grad_(True)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])

    terms = grpo_loss(current, sampling, advantages, mask, clip_epsilon=0.2)
    # min(1·1, 1·1) = 1; min(1.5·1, 1.2·1) = 1.2; min(0.5·-1, 0.8·-1) = -0.8; three tokens.
    assert terms.loss.item() == pytest.approx(-(1.0 + 1.2 - 0.8) / 3, abs=1e-6)
    assert terms.clipped_fraction == pytest.approx(2 / 3)
    terms.loss.backward()
    # Only the unclipped token passes a gradient: d/dlogπ of -ρ·A/3 at ρ = 1 is -1/3.
    assert current.grad.flatten().tolist() == pytest.approx([-1 / 3, 0.0, 0.0, 0.0], abs=1e-6)


def test_it_divides_by_the_whole_batch_token_count_for_micro_batches():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    terms = grpo_loss(logprobs, torch.zeros(1, 2), torch.tensor([2.0]), torch.ones(1, 2), num_tokens=8)
    assert terms.loss.item() == pytest.approx(-(2.0 + 2.0) / 8)


def test_it_reports_zero_mismatch_when_trainer_and_sampler_agree():
    logprobs = torch.log(torch.tensor([[0.3, 0.6]]))
    assert grpo_loss(logprobs, logprobs.clone(), torch.tensor([1.0]), torch.ones(1, 2)).mismatch_kl == 0.0
    shifted = grpo_loss(logprobs, logprobs - 0.1, torch.tensor([1.0]), torch.ones(1, 2)).mismatch_kl
    assert shifted == pytest.approx(math.exp(0.1) - 1 - 0.1, rel=1e-5)


def test_it_scores_tokens_under_the_temperature_scaled_policy():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logprob, entropy = token_logprobs_and_entropy(logits, torch.tensor([[1]]))
    assert logprob.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    logprob_hot, _ = token_logprobs_and_entropy(logits, torch.tensor([[1]]), temperature=2.0)
    assert logprob_hot.item() == pytest.approx(math.log(math.sqrt(3) / (1 + math.sqrt(3))))


def test_groups_of_different_sizes_are_each_normalised_over_their_own_rollouts():
    # [[env]] group_size: a group of 2, one of 4 and one of 3 in one batch.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5])
    advantages = group_advantages(rewards, group_size=[2, 4, 3])
    expected = torch.cat([group_advantages(rewards[:2], 2), group_advantages(rewards[2:6], 4), group_advantages(rewards[6:], 3)])
    assert advantages.tolist() == pytest.approx(expected.tolist(), rel=1e-12)
    assert advantages[:2].tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001], rel=1e-6)
    assert advantages[6:].tolist() == [0.0, 0.0, 0.0]  # equal rewards


def test_groups_of_different_sizes_take_their_means_over_the_rollouts_kept():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 3.0, 1.0])
    keep = torch.tensor([True, True, True, False, True, True])
    advantages = group_advantages(rewards, group_size=[2, 4], keep=keep)
    # the group of 4 keeps 1, 3, 1: mean 5/3, population std sqrt(8)/3; the dropped one gets 0
    std = math.sqrt(8) / 3 + 1e-4
    assert advantages.tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -2 / 3 / std, 0.0, 4 / 3 / std, -2 / 3 / std], rel=1e-6)


def test_one_size_per_group_that_is_the_same_for_all_is_the_fixed_size_path():
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(0))
    assert torch.equal(group_advantages(rewards, group_size=[4, 4, 4]), group_advantages(rewards, group_size=4))


def test_it_refuses_group_sizes_that_do_not_add_up_to_the_rewards():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(6), group_size=[2, 3])
