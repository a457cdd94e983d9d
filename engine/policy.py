"""The trainable policy: LoRA or full fine-tuning, and its forward pass over rollouts.

Rollouts come in groups that share one prompt (GRPO). The forward pass runs each prompt once,
repeats its key/value cache for the group, then runs the completions on top of it. Every
operation is differentiable (the repeat too), so the gradient is exactly that of running each
(prompt, completion) pair separately, for about half the tokens when prompts are as long as
completions.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import peft
import torch

from engine.catalog import LORA_TARGET_MODULES
from engine.distributed import is_sharded, whole
from engine.groups import uniform_size

if TYPE_CHECKING:
    from engine.routing import RouterStatistics


def make_trainable(model: torch.nn.Module, *, lora_rank: int, lora_alpha: int, base_model_id: str) -> torch.nn.Module:
    """Wrap `model` for training: LoRA (peft) or, for rank 0, full weights.

    LoRA (Hu et al. 2021) with dropout 0 and no bias, so the forward pass uses no randomness,
    on the attention and MLP projections of the model's architecture
    (`engine.catalog.LORA_TARGET_MODULES`: for a mixture of experts, its experts' 3-D weights,
    which peft targets as parameters); an architecture without an entry gets every linear layer
    (peft's "all-linear"). The output layer stays frozen. The adapter's `base_model_name_or_path`
    is the catalogue id, so a saved adapter names its base model the way Lab and vLLM know it
    rather than by a local path.
    """
    if lora_rank > 0:
        targets = LORA_TARGET_MODULES.get(getattr(model.config, "model_type", None))
        config = peft.LoraConfig(
            r=lora_rank,
            lora_alpha=lora_alpha,
            lora_dropout=0.0,
            bias="none",
            target_modules=list(targets) if targets else "all-linear",
            task_type="CAUSAL_LM",
        )
        model.name_or_path = base_model_id  # peft copies this into the adapter config
        with warnings.catch_warnings():
            # peft sets gate_up_proj's rank and alpha for a fused mixture of experts itself
            # (LORA_TARGET_MODULES), then warns that the pattern matched no module: it matched the parameter.
            warnings.filterwarnings("ignore", r"The following (rank|alpha)_pattern keys did not match", RuntimeWarning)
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
    parameter name (`...q_proj.weight`; for adapted expert weights, peft's `ParamWrapper`, the
    parameter's own name, `...mlp.experts.gate_up_proj`); full fine-tuning: every trainable
    parameter. Tensors are detached. A model sharded with FSDP2 (engine/distributed.py) gives
    each parameter whole, gathered as it is yielded: a collective, so every rank must go through
    all the weights in step.
    """
    if is_lora(model):
        from peft.tuners.lora import LoraLayer

        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, LoraLayer) and hasattr(module, "get_delta_weight"):
                    base_layer = module.get_base_layer()
                    adapter = module.active_adapters[0]
                    # A ParamWrapper adapts one parameter of its (innermost) base layer; two
                    # wrappers of one experts module nest, the inner one named `.base_layer`.
                    parameter = getattr(module, "parameter_name", "weight")
                    merged = getattr(base_layer, parameter) + module.get_delta_weight(adapter)
                    plain = name.removeprefix("base_model.model.").replace(".base_layer", "")
                    yield f"{plain}.{parameter}", merged.detach()
    else:
        for name, parameter in trainable_parameters(model):
            yield name, whole(parameter.detach())


#: The files of a peft adapter directory (what `PeftModel.save_pretrained` writes, vLLM's
#: `LoRARequest` and `PeftModel.from_pretrained` read).
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass
class PolicyAdapter:
    """The trainer's LoRA adapter in peft's format, detached from the model.

    `config`: the adapter's `adapter_config.json` (peft's `LoraConfig.to_dict()`, sets as
    lists); `tensors`: its `adapter_model.safetensors` under peft's saved names
    (`base_model.model.<module>.lora_A.weight` [r, in], `....lora_B.weight` [out, r]), on CPU.
    """

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def rank(self) -> int:
        """The adapter's LoRA rank r."""
        return int(self.config["r"])

    def save(self, directory: pathlib.Path) -> pathlib.Path:
        """Write the adapter as a peft directory (`adapter_config.json`, `adapter_model.safetensors`),
        replacing `directory` whole (written beside it, then renamed); return `directory`."""
        from safetensors.torch import save_file

        directory = pathlib.Path(directory)
        partial = directory.with_name(f".{directory.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        (partial / ADAPTER_CONFIG_FILE).write_text(json.dumps(self.config, indent=2, sort_keys=True))
        save_file({name: tensor.contiguous() for name, tensor in self.tensors.items()}, str(partial / ADAPTER_WEIGHTS_FILE),
                  metadata={"format": "pt"})
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(partial, directory)
        return directory

    @classmethod
    def read(cls, directory: pathlib.Path) -> PolicyAdapter:
        """Read a peft adapter directory. Raises ValueError when it is not one (a file missing,
        a config that is not a JSON object, weights that are not safetensors)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        directory = pathlib.Path(directory)
        config = read_adapter_config(directory)
        try:
            tensors = load_file(str(directory / ADAPTER_WEIGHTS_FILE))
        except (OSError, SafetensorError) as error:
            raise ValueError(f"{directory}/{ADAPTER_WEIGHTS_FILE} is not a safetensors file: {error}") from None
        return cls(config=config, tensors=tensors)


def read_adapter_config(directory: pathlib.Path) -> dict[str, Any]:
    """The `adapter_config.json` of a peft adapter directory. Raises ValueError when it is
    missing or is not a LoRA config (a JSON object with an integer rank `r` and `lora_alpha`)."""
    path = pathlib.Path(directory) / ADAPTER_CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not readable JSON: {error}") from None
    if not isinstance(config, dict) or not isinstance(config.get("r"), int) or not isinstance(config.get("lora_alpha"), (int, float)):
        raise ValueError(f"{path} is not a LoRA adapter config (an integer r and lora_alpha)")
    return config


def is_adapter_dir(directory: pathlib.Path) -> bool:
    """True when `directory` holds a peft adapter (its `adapter_config.json`)."""
    return (pathlib.Path(directory) / ADAPTER_CONFIG_FILE).is_file()


def policy_adapter(model: torch.nn.Module) -> PolicyAdapter:
    """Return a copy of a peft `model`'s adapter (`PolicyAdapter`), safe to write or send while the
    trainer updates its own weights. Raises ValueError for a model that is not a peft model."""
    if not is_lora(model):
        raise ValueError("full fine-tuning has no adapter: its policy travels as weights")
    # Embeddings are never adapted here ("all-linear"); "auto" would look the base model's config
    # up by its id, which is the catalogue id rather than a path.
    with torch.no_grad():
        state = peft.get_peft_model_state_dict(model, save_embedding_layers=False)
        tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}
    config = model.peft_config["default"].to_dict()
    config = {key: sorted(value) if isinstance(value, set) else value for key, value in config.items()}
    return PolicyAdapter(config=json.loads(json.dumps(config, default=str)), tensors=tensors)


def takes_adapter(backend: Any, model: torch.nn.Module) -> bool:
    """Whether the policy goes to `backend` as a LoRA adapter (`backend.load_adapter`) rather than
    as merged weights (`backend.load_weights`): when the trainer trains an adapter and the backend
    says it applies adapters itself (`weights_format == "lora"`: vLLM started with LoRA)."""
    return is_lora(model) and getattr(backend, "weights_format", "merged") == "lora"


def policy_snapshot(model: torch.nn.Module, backend: Any, *, copy_weights: bool = False):
    """What `backend` takes of the policy now: a `PolicyAdapter` (copied) when `takes_adapter`,
    else `policy_weights` (as it yields them, one tensor at a time, or a list of copies with
    `copy_weights`, so that the trainer may update its own weights before the backend loads
    them). Load it with `load_policy`."""
    if takes_adapter(backend, model):
        return policy_adapter(model)
    if copy_weights:
        return [(name, tensor.clone()) for name, tensor in policy_weights(model)]
    return policy_weights(model)


def load_policy(backend: Any, snapshot, policy_version: int) -> None:
    """Load a `policy_snapshot` into `backend` as `policy_version`: an adapter through
    `load_adapter`, weights through `load_weights`."""
    if isinstance(snapshot, PolicyAdapter):
        backend.load_adapter(snapshot, policy_version=policy_version)
    else:
        backend.load_weights(snapshot, policy_version=policy_version)


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


def completion_logits(model: torch.nn.Module, batch: PackedRollouts, routing: RouterStatistics | None = None) -> torch.Tensor:
    """Return the logits that predict each completion token: float [G·K, C, V].

    Row i, position t holds the logits of the distribution the completion's token t was
    drawn from (position 0 comes from the prompt's last token). Positions count only real
    tokens, matching the sampler. Gradients flow through the shared prompt computation.
    `routing` (a mixture of experts' engine.routing.RouterStatistics) counts the routing of the
    prompts' real tokens and of the completions' tokens the loss covers.
    """
    device = next(model.parameters()).device
    # One K for every group repeats the prompt rows K times each; groups of different sizes
    # repeat each row by its own K (the same operation with a tensor of repeats).
    group_size = batch.group_size if isinstance(batch.group_size, int) else torch.tensor(batch.group_size, device=device)
    prompt_ids, prompt_mask = batch.prompt_ids.to(device), batch.prompt_mask.to(device)
    completion_ids = batch.completion_ids.to(device)
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    if routing is not None:
        routing.expect(prompt_mask)
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
        if routing is not None:
            routing.expect(None)
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
    if routing is not None:
        routing.expect(batch.completion_mask[:, :-1])
    output = model(
        input_ids=completion_ids[:, :-1],
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
    )
    if routing is not None:
        routing.expect(None)
    return torch.cat([first, output.logits], dim=1)


def join_weight_gather(model: torch.nn.Module) -> None:
    """Take part, on a rank that sends no policy, in the gathers that another rank's
    engine.policy.policy_weights makes of a sharded model; nothing for any other model."""
    if is_sharded(model):
        for _ in policy_weights(model):
            pass
