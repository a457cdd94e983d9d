"""Data-parallel training across processes: the trainer under `torchrun`.

    torchrun --standalone --nproc-per-node N -m engine run ...

Each of the N ranks holds the whole policy and samples the whole batch (rollouts are seeded
by the spec's seed and the step, so every rank draws the same ones), trains on its share of
the batch's groups, and the ranks sum their gradients before the optimizer step. The GRPO
and SFT losses are already normalized by the token count of the *whole* batch, so a rank's
gradient is its part of the full-batch gradient and the sum is the one-process gradient
(up to the order of float additions): the same loss and the same weights as one process
with the same global batch. This is what DDP does for a LoRA adapter, written out so that it
also covers the engine's micro-batching and its skipped zero-advantage groups. Full
fine-tuning of a model too large for one device needs FSDP2 sharding, which this module does
not do.

Backend: gloo on CPU (what the tests run, with 2 processes), NCCL on CUDA. Rank 0 alone
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

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


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
        environ = os.environ if environ is None else environ
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

    def any(self, flag: bool) -> bool:
        """Return whether `flag` is true on any rank (every rank must call it)."""
        return bool(self.sum([1.0 if flag else 0.0])[0]) if self.world_size > 1 else flag

    def close(self) -> None:
        """Leave the process group; safe to call twice."""
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
