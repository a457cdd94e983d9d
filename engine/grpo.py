"""GRPO: group-relative advantages and the clipped token-level policy-gradient loss.

Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", §4.1): sample a group
of G completions per prompt, normalise each reward by its group's mean and standard
deviation, and maximise the PPO clipped surrogate (Schulman et al. 2017, eq. 7) of every
completion token with that advantage. Choices here: no KL penalty to a reference model
(β = 0); the loss is averaged over all completion tokens of the batch (token-level, as in
DAPO, Yu et al. 2025), so long completions are not down-weighted; the importance ratio is
taken against the sampling policy's log-probabilities, so off-policy batches stay correct.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from engine.groups import group_sizes_list, group_starts, row_groups, uniform_size

# A group whose reward spread is below this is "all equal" and contributes nothing.
EQUAL_REWARDS_TOLERANCE = 1e-6


def group_advantages(
    rewards: torch.Tensor, group_size: int | Sequence[int], eps: float = 1e-4, *, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """Return A_i = (r_i − mean(group)) / (std(group) + eps) for each rollout.

    `rewards`: float [N], each group contiguous; `group_size`: the rollouts of every group
    (N = groups × group_size), or one size per group (they sum to N) when the groups of a
    batch differ in size (`[[env]] group_size`, engine/groups.py). `keep`:
    bool [N] or None (all kept): the rollouts still in the batch after the pre-batch filters;
    a group's mean and std are taken over its kept rollouts only, and dropped rollouts get
    advantage 0. std is the population standard deviation (divisor: the kept count). Groups
    whose kept rewards are all equal (spread < 1e-6) get advantage exactly 0: they carry no
    signal about which completion is better. Returns float [N].
    """
    size = uniform_size(group_size)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D with a multiple of {size} entries" if size else "rewards must be 1-D")
    if size is None:
        return _mixed_group_advantages(rewards, group_sizes_list(group_size, rewards.numel()), eps, keep)
    if rewards.numel() % size:
        raise ValueError(f"rewards must be 1-D with a multiple of {size} entries")
    grouped = rewards.double().view(-1, size)
    kept = torch.ones_like(grouped, dtype=torch.bool) if keep is None else keep.view(-1, size).to(torch.bool)
    return _grouped_advantages(grouped, kept, eps).view(-1).to(rewards.dtype)


def _mixed_group_advantages(rewards: torch.Tensor, sizes: list[int], eps: float, keep: torch.Tensor | None) -> torch.Tensor:
    """`group_advantages` for groups of `sizes` rollouts: each group is a row of a
    [groups, largest size] matrix whose slots past the group's own size count as dropped, so
    every group's mean, std and spread are those of its own rollouts."""
    width = max(sizes)
    rows = torch.tensor(row_groups(sizes), dtype=torch.long)
    columns = torch.arange(len(rows)) - torch.tensor(group_starts(sizes)[:-1], dtype=torch.long)[rows]
    grouped = torch.zeros((len(sizes), width), dtype=torch.float64)
    grouped[rows, columns] = rewards.double()
    kept = torch.zeros((len(sizes), width), dtype=torch.bool)
    kept[rows, columns] = True if keep is None else keep.to(torch.bool)
    return _grouped_advantages(grouped, kept, eps)[rows, columns].to(rewards.dtype)


def _grouped_advantages(grouped: torch.Tensor, kept: torch.Tensor, eps: float) -> torch.Tensor:
    """The advantages of `grouped` (float64 [groups, K]) over the `kept` entries (bool, same
    shape); entries not kept get 0."""
    weights = kept.double()
    count = weights.sum(dim=1, keepdim=True).clamp(min=1.0)
    mean = (grouped * weights).sum(dim=1, keepdim=True) / count
    std = (((grouped - mean) ** 2) * weights).sum(dim=1, keepdim=True).div(count).sqrt()
    advantages = (grouped - mean) / (std + eps)
    highest = torch.where(kept, grouped, torch.full_like(grouped, -torch.inf)).max(dim=1, keepdim=True).values
    lowest = torch.where(kept, grouped, torch.full_like(grouped, torch.inf)).min(dim=1, keepdim=True).values
    spread = torch.nan_to_num(highest - lowest, nan=0.0, posinf=0.0, neginf=0.0)
    return torch.where((spread < EQUAL_REWARDS_TOLERANCE) | ~kept, torch.zeros_like(advantages), advantages)


def token_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return log π(target) and the entropy of π per position, π = softmax(logits / T).

    `logits`: [B, T, V]; `targets`: long [B, T]. Returns two float32 tensors [B, T] (nats).
    The temperature is the sampling temperature, so trainer and sampler score the same policy.
    """
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    log_probs = torch.log_softmax(scaled, dim=-1)
    chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return chosen, entropy


@dataclass
class LossTerms:
    """The scalar loss to backpropagate and detached statistics (token means over the mask)."""

    loss: torch.Tensor
    clipped_fraction: float
    mismatch_kl: float
    ratio_mean: float


def grpo_loss(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_epsilon: float = 0.2,
    num_tokens: int | None = None,
) -> LossTerms:
    """Return the clipped GRPO surrogate loss, averaged over completion tokens.

    loss = −(1/|T|) Σ_{i,t ∈ T} min(ρ_{i,t} A_i, clip(ρ_{i,t}, 1−ε, 1+ε) A_i),
    ρ_{i,t} = exp(log π_θ(o_{i,t}) − log π_sample(o_{i,t})) (PPO, Schulman et al. 2017, eq. 7;
    GRPO, Shao et al. 2024, eq. 3 with β = 0, token-level average).

    `logprobs`: [B, T] under the policy being trained (with grad); `sampling_logprobs`:
    [B, T] from the policy that sampled the tokens; `advantages`: [B]; `mask`: [B, T], 1 on
    completion tokens. `num_tokens` is |T| for the whole batch when this call sees one
    micro-batch of it (default: mask.sum()).

    `mismatch_kl` is the k3 estimator of KL(π_sample ‖ π_θ) per token, E[ρ − 1 − log ρ]
    (Schulman 2020, "Approximating KL divergence"): 0 when trainer and sampler agree.
    """
    mask = mask.to(logprobs.dtype)
    denominator = float(num_tokens) if num_tokens is not None else mask.sum().clamp(min=1.0)
    log_ratio = logprobs - sampling_logprobs.detach()
    ratio = torch.exp(log_ratio)
    advantage = advantages.detach().unsqueeze(-1).to(logprobs.dtype)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon) * advantage
    surrogate = torch.minimum(unclipped, clipped)
    loss = -(surrogate * mask).sum() / denominator
    with torch.no_grad():
        count = mask.sum().clamp(min=1.0)
        was_clipped = ((ratio - torch.clamp(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)).abs() > 0).to(mask.dtype)
        k3 = ratio - 1.0 - log_ratio
        return LossTerms(
            loss=loss,
            clipped_fraction=float((was_clipped * mask).sum() / count),
            mismatch_kl=float((k3 * mask).sum() / count),
            ratio_mean=float((ratio * mask).sum() / count),
        )


def sft_loss(logprobs, mask, *, num_tokens: int):
    """The supervised loss of one micro-batch: −Σ log π(token) over its real completion tokens
    divided by `num_tokens`, the completion tokens of the whole step, so that summing the
    micro-batches' losses gives the step's mean negative log-likelihood per token (nats).

    `logprobs` and `mask` are float [rows, C] (mask 1 on real tokens, 0 on padding).
    """
    return -(logprobs * mask).sum() / max(num_tokens, 1)
