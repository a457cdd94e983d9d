"""Data-parallel training across processes: the trainer under `torchrun`.

    torchrun --standalone --nproc-per-node N -m engine run ...

Each of the N ranks samples the whole batch (rollouts are seeded by the spec's seed and the
step, so every rank draws the same ones) and trains on its share of the batch's groups. The
GRPO and SFT losses are normalized by the token count of the *whole* batch, so a rank's
gradient is its part of the full-batch gradient and the sum over ranks is the one-process
gradient (up to the order of float additions): the same loss and the same weights as one
process with the same global batch. How the ranks hold the policy depends on what trains:

- LoRA: every rank holds the whole model and the ranks sum their gradients before the
  optimizer step (`DataParallel.sum_gradients`, one flat all-reduce). This is what DDP does for
  an adapter, written out so that it also covers the engine's micro-batching and its skipped
  zero-advantage groups.
- Full fine-tuning (`lora_rank = 0`): the policy is sharded with FSDP2
  (`torch.distributed.fsdp.fully_shard`, each transformer block and then the root,
  `DataParallel.shard_model`), so each rank holds 1/N of the parameters, gradients and AdamW
  state. FSDP2 reduce-scatters the gradients itself and averages them by default; here it sums
  (divide factor 1, sum-only reductions, which gloo has), so the result is again the
  one-process gradient, and `sum_gradients` is not called. Every forward and backward pass of a
  sharded model is a collective (all-gathers, reduce-scatters) that every rank must run in
  step, so the trainer gives every rank the same number of micro-batches (a rank short of
  them runs a zero-weight pass) and the same number of forward calls in each. Gradient-norm
  clipping sees DTensor gradients and takes the global norm. Whatever reads the whole weights
  gathers them on every rank first: checkpoints and exports (`full_weights`,
  `full_optimizer_state`: the full state on rank 0, which alone writes it, in the same format
  as a one-process checkpoint, so either resumes the other), resumes (`load_full_weights`:
  rank 0 reads the weights, which are broadcast, each rank keeping its shard;
  `load_full_optimizer_state`: every rank reads the optimizer state and keeps its shard), and the policy sent to the rollout backend or inference role after each update
  (engine.policy.policy_weights gathers each parameter; a rank that sends nothing still takes
  part, `join_weight_gather`). In-process sampling and rank 0's evals run on a plain copy of
  the policy taken before sharding (a sharded forward pass on rank 0 alone would wait forever
  for the others), loaded with the gathered weights after each update: on top of its shard,
  each rank holds that one copy of the weights, without gradients or optimizer state.

Backend: gloo on CPU (what the tests run, with 2 processes: the LoRA sum and FSDP2 full
fine-tuning both), NCCL on CUDA (written for, never run here: no GPU). Rank 0 alone
reports to Lab, writes checkpoints and adapters; a stop that rank 0 hears (SIGTERM, Lab's
`action: stop`) reaches every rank through `any()` at the end of each step. Rank 0 alone opens
the attempt and fetches the checkpoint it resumes from; the other ranks take both from it
(`broadcast()`), so every rank trains the same attempt from the same weights.

As the trainer role (`torchrun ... -m engine trainer`, docs/engine.md "Three roles"), every
rank reads the orchestrator role's batches from the shared directory and rank 0 alone owns it:
it starts the session, publishes the policy after each update and removes what was read.

The environment is torchrun's: `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR`,
`MASTER_PORT`. Without `WORLD_SIZE` (or with 1) everything here is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from engine.config import environment

T = TypeVar("T")

logger = logging.getLogger("engine")


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the ranks of one job's trainer (`rank` of `world_size`)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> DataParallel:
        """Join torchrun's process group (gloo on CPU, NCCL on CUDA) when `WORLD_SIZE` > 1.

        Raises ValueError for a `RANK` outside `0..WORLD_SIZE-1`.
        """
        environ = environment() if environ is None else environ
        world_size = int(environ.get("WORLD_SIZE", "1"))
        rank = int(environ.get("RANK", "0"))
        if world_size <= 1:
            return cls()
        if not 0 <= rank < world_size:
            raise ValueError(f"RANK {rank} is not in 0..{world_size - 1}")
        import torch.distributed as dist

        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(rank=rank, world_size=world_size)

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the rank that reports, checkpoints and exports)."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """Return this rank's contiguous share of `items` (sizes differ by at most one)."""
        per_rank, extra = divmod(len(items), self.world_size)
        start = self.rank * per_rank + min(self.rank, extra)
        return list(items[start:start + per_rank + (1 if self.rank < extra else 0)])

    def sum_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Replace each parameter's gradient by its sum over the ranks (one flat all-reduce)."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        grads = [p.grad for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Return the element-wise sums of `values` over the ranks (float64)."""
        if self.world_size == 1:
            return list(values)
        import torch.distributed as dist

        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def broadcast(self, value: T) -> T:
        """Return rank 0's `value` on every rank (every rank must call it; `value` must pickle:
        the ranks are one program's processes, trusted alike)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def maximum(self, value: int) -> int:
        """Return the largest `value` of any rank (every rank must call it)."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def shard_model(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """Shard `model`'s parameters over the ranks with FSDP2 and return it (the same object).

        Each transformer block (the classes a Hugging Face model names in `_no_split_modules`)
        becomes one FSDP unit, then the root (embeddings, final norm, output layer; tied
        embeddings stay one parameter there). Gradients are summed over the ranks, not averaged
        (divide factor 1, sum-only reductions): the losses are already normalized by the whole
        batch's tokens. Logs how many parameters this rank holds.
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        total = sum(parameter.numel() for parameter in model.parameters())
        mesh = init_device_mesh(device.type, (self.world_size,))
        block_classes = set(getattr(model, "_no_split_modules", None) or ())
        blocks = [module for module in model.modules() if type(module).__name__ in block_classes]
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for unit in [*blocks, model]:
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        local = sum(parameter.to_local().numel() for parameter in model.parameters())
        logger.info(
            "FSDP2: rank %d of %d holds %d of the policy's %d parameters (%.1f%%) in %d blocks + root",
            self.rank, self.world_size, local, total, 100.0 * local / total, len(blocks),
        )
        return model

    def any(self, flag: bool) -> bool:
        """Return whether `flag` is true on any rank (every rank must call it)."""
        return bool(self.sum([1.0 if flag else 0.0])[0]) if self.world_size > 1 else flag

    def close(self) -> None:
        """Leave the process group; safe to call twice."""
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


# ---- a model sharded with FSDP2 (full fine-tuning under torchrun) ----


def is_sharded(model: torch.nn.Module) -> bool:
    """True when `model` was sharded by `DataParallel.shard_model` (FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """Return `tensor` whole: a DTensor (a shard, or a value every rank holds) gathered with
    `full_tensor()`, a collective every rank must join; any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _state_dict_options(**options):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **options)


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gather a sharded model's full state dict onto rank 0's CPU; every rank must call it.

    Returns the state dict on rank 0 and {} on the others. Names that share one parameter
    (tied input and output embeddings) share one tensor, as in a plain model's state dict, so
    `save_pretrained` writes it once: the same `model.safetensors` as one process writes.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    weights = get_model_state_dict(model, options=_state_dict_options(cpu_offload=True))
    if weights:
        names: dict[int, list[str]] = {}
        for name, parameter in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(parameter), []).append(name)
        for aliases in names.values():
            for alias in aliases[1:]:
                if aliases[0] in weights and alias in weights:
                    weights[alias] = weights[aliases[0]]
    return weights


def _optimizer_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of `optimizer`'s parameters, in the order of its state dict's indexes."""
    name_of = {id(parameter): name for name, parameter in model.named_parameters()}
    return [name_of[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Gather a sharded model's optimizer state onto rank 0's CPU; every rank must call it.

    Returns, on rank 0, what `optimizer.state_dict()` returns in one process for the same
    parameters (state and param groups keyed by parameter index, full tensors), and {} on the
    others: torch.distributed.checkpoint keys the state by parameter name, which is translated.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    gathered = get_optimizer_state_dict(model, optimizer, options=_state_dict_options(cpu_offload=True))
    if not gathered:
        return {}
    index = {name: i for i, name in enumerate(_optimizer_names(model, optimizer))}
    return {
        "state": dict(sorted((index[name], values) for name, values in gathered["state"].items())),
        "param_groups": [{**group, "params": [index[name] for name in group["params"]]} for group in gathered["param_groups"]],
    }


def load_full_weights(model: torch.nn.Module, read: Callable[[], dict[str, torch.Tensor]]) -> tuple[list[str], list[str]]:
    """Load full weights into a sharded model; every rank must call it.

    `read` is called on rank 0 alone (the file is read once); its tensors are broadcast and
    each rank keeps its shard. Returns (missing, unexpected) names as `load_state_dict` does;
    a weight tied to another (the output embeddings) loads with it.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    weights = read() if dist.get_rank() == 0 else {}
    result = set_model_state_dict(model, weights, options=_state_dict_options(broadcast_from_rank0=True, strict=False))
    return list(result.missing_keys), list(result.unexpected_keys)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a one-process optimizer state dict (`full_optimizer_state`'s format, read by every
    rank) into the optimizer of a sharded model: each rank keeps, of every tensor shaped like its
    parameter, the shard that matches the parameter's; scalars (AdamW's step) load as they are.

    Split locally, with no collective (torch.distributed.checkpoint's set_optimizer_state_dict
    needs optimizer state to exist already, which a fresh optimizer whose gradients are zeros,
    not None, does not have).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
    state = {}
    for index, values in saved["state"].items():
        parameter = parameters[index]
        state[index] = {
            key: distribute_tensor(value.to(parameter.device), parameter.device_mesh, parameter.placements, src_data_rank=None)
            if isinstance(parameter, DTensor) and value.shape == parameter.shape else value
            for key, value in values.items()
        }
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
