"""The trainable policy: LoRA or full fine-tuning, and its forward pass over rollouts.

Rollouts come in groups that share one prompt (GRPO). The forward pass runs each prompt once,
repeats its key/value cache for the group, then runs the completions on top of it. Every
operation is differentiable (the repeat too), so the gradient is exactly that of running each
(prompt, completion) pair separately, for about half the tokens when prompts are as long as
completions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import peft
import torch

from engine.groups import uniform_size


def make_trainable(model: torch.nn.Module, *, lora_rank: int, lora_alpha: int, base_model_id: str) -> torch.nn.Module:
    """Wrap `model` for training: LoRA on every linear layer (peft) or, for rank 0, full weights.

    LoRA (Hu et al. 2021) with dropout 0 and no bias, so the forward pass uses no randomness;
    the output layer stays frozen (peft's "all-linear" leaves it out). The adapter's
    `base_model_name_or_path` is the catalogue id, so a saved adapter names its base model
    the way Lab and vLLM know it rather than by a local path.
    """
    if lora_rank > 0:
        config = peft.LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=0.0,
            bias="none",
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        model.name_or_path = base_model_id  # peft copies this into the adapter config
        model = peft.get_peft_model(model, config)
        model.peft_config["default"].base_model_name_or_path = base_model_id
    else:
        for parameter in model.parameters():
            parameter.requires_grad_(True)
    model.train()
    return model


def is_lora(model: torch.nn.Module) -> bool:
    """True when `model` is a peft model (its checkpoints are adapters)."""
    return isinstance(model, peft.PeftModel)


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Return (name, parameter) for every parameter that receives gradients, in module order."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def rollout_policy(model: torch.nn.Module) -> torch.nn.Module:
    """Return a separate inference copy of the policy for a rollout backend.

    For LoRA the copy is the plain base architecture with the adapter merged into its
    weights (W + s·B·A), so sampling runs no adapter layers (on CPU the extra small matmuls
    of unmerged LoRA dominate decoding); `policy_weights` gives the merged tensors to load
    after each optimizer step, as an inference server would receive them.
    """
    if is_lora(model):
        clone = copy.deepcopy(model).merge_and_unload()
    else:
        clone = copy.deepcopy(model)
    for parameter in clone.parameters():
        parameter.requires_grad_(False)
    clone.eval()
    return clone


def policy_weights(model: torch.nn.Module):
    """Yield (name, tensor) of the weights an inference copy needs to match the trainer's policy.

    LoRA: for every adapted linear layer, its merged weight W + s·B·A under the plain model's
    parameter name; full fine-tuning: every trainable parameter. Tensors are detached.
    """
    if is_lora(model):
        from peft.tuners.lora import LoraLayer

        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, LoraLayer) and hasattr(module, "get_delta_weight"):
                    base_layer = module.get_base_layer()
                    adapter = module.active_adapters[0]
                    merged = base_layer.weight + module.get_delta_weight(adapter)
                    yield name.removeprefix("base_model.model.") + ".weight", merged.detach()
    else:
        for name, parameter in trainable_parameters(model):
            yield name, parameter.detach()


@dataclass
class PackedRollouts:
    """Groups of rollouts as tensors.

    `prompt_ids`, `prompt_mask`: long [G, P], prompts left-padded; `completion_ids`,
    `completion_mask`: long [G·K, C], completions right-padded, rows of one group adjacent, 1 on
    the tokens the loss covers (a multi-turn rollout's environment turns are 0);
    `group_size` is K, or one K per group when the groups differ in size (then the
    completions are ΣK rows).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    group_size: int | list[int]


def pack_rollouts(
    prompts: list[list[int]], completions: list[list[int]], group_size: int | Sequence[int], pad_token_id: int,
    loss_masks: list[list[int] | None] | None = None,
) -> PackedRollouts:
    """Pad G prompts (left) and G·K completions (right) into tensors; empty completions are allowed.

    `group_size`: K for every prompt, or one K per prompt (groups of different sizes; a list
    whose sizes are all equal packs as that one K). `loss_masks`: per completion, None (every
    token is sampled) or one 0/1 per token (`Completion.loss_mask`); it becomes the
    completion's row of `completion_mask`.
    """
    size = uniform_size(group_size)
    if size is not None:
        group_size = size
        if len(completions) != len(prompts) * group_size:
            raise ValueError("need group_size completions per prompt")
    else:
        group_size = list(group_size)
        if len(group_size) != len(prompts) or sum(group_size) != len(completions):
            raise ValueError("need one group size per prompt, and as many completions as they add up to")
    if loss_masks is not None and len(loss_masks) != len(completions):
        raise ValueError("need one loss mask (or None) per completion")
    prompt_width = max(len(p) for p in prompts)
    completion_width = max(1, max(len(c) for c in completions))
    prompt_ids = torch.full((len(prompts), prompt_width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for row, prompt in enumerate(prompts):
        prompt_ids[row, prompt_width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[row, prompt_width - len(prompt):] = 1
    completion_ids = torch.full((len(completions), completion_width), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros_like(completion_ids)
    for row, completion in enumerate(completions):
        if completion:
            completion_ids[row, : len(completion)] = torch.tensor(completion, dtype=torch.long)
            mask = loss_masks[row] if loss_masks is not None else None
            if mask is None:
                completion_mask[row, : len(completion)] = 1
            elif len(mask) != len(completion):
                raise ValueError(f"completion {row} has {len(completion)} tokens and a loss mask of {len(mask)}")
            else:
                completion_mask[row, : len(completion)] = torch.tensor(mask, dtype=torch.long)
    return PackedRollouts(prompt_ids, prompt_mask, completion_ids, completion_mask, group_size)


def completion_logits(model: torch.nn.Module, batch: PackedRollouts) -> torch.Tensor:
    """Return the logits that predict each completion token: float [G·K, C, V].

    Row i, position t holds the logits of the distribution the completion's token t was
    drawn from (position 0 comes from the prompt's last token). Positions count only real
    tokens, matching the sampler. Gradients flow through the shared prompt computation.
    """
    device = next(model.parameters()).device
    # One K for every group repeats the prompt rows K times each; groups of different sizes
    # repeat each row by its own K (the same operation with a tensor of repeats).
    group_size = batch.group_size if isinstance(batch.group_size, int) else torch.tensor(batch.group_size, device=device)
    prompt_ids, prompt_mask = batch.prompt_ids.to(device), batch.prompt_mask.to(device)
    completion_ids = batch.completion_ids.to(device)
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    prompt_output = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=prompt_positions,
        use_cache=True,
        logits_to_keep=1,
    )
    first = prompt_output.logits[:, -1:, :].repeat_interleave(group_size, dim=0)
    width = completion_ids.shape[1]
    if width == 1:
        return first
    cache = prompt_output.past_key_values
    if isinstance(group_size, int):
        cache.batch_repeat_interleave(group_size)
    else:
        cache.batch_select_indices(torch.arange(len(batch.group_size), device=device).repeat_interleave(group_size))
    rows = completion_ids.shape[0]
    attention_mask = torch.cat(
        [prompt_mask.repeat_interleave(group_size, dim=0), torch.ones((rows, width - 1), dtype=prompt_mask.dtype, device=device)],
        dim=1,
    )
    start = prompt_positions[:, -1:].repeat_interleave(group_size, dim=0) + 1
    positions = start + torch.arange(width - 1, device=device).unsqueeze(0)
    output = model(
        input_ids=completion_ids[:, :-1],
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([first, output.logits], dim=1)
