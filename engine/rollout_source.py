"""What a trainer takes its batches from (`RolloutSource`), handed to it by the entry point
that composes a run (engine/commands/run.py): the interface between the trainer and the
orchestrator's side, as prime-rl's trainer reads the orchestrator's batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from engine.orchestrator import RolloutBatch
    from engine.trainer import Trainer


class RolloutSource(Protocol):
    """Where a trainer's batches come from, given to it by the entry point that composes the run:
    an orchestrator in this process (engine.colocated.InProcessRollouts) or the orchestrator role
    over a shared directory (engine.trainer_role.SharedDirRollouts).

    `prepare(trainer, base)` runs in `Trainer.setup` with the base model loaded, before LoRA wraps
    it; `before_sharding(trainer)` before FSDP2 shards a fully fine-tuned policy (torchrun);
    `setup(trainer)` once the policy and optimizer exist. `start()` begins the run (after any
    resume) and returns eval/val metrics by step; `next_batch(step)` returns the step's batch and
    the seconds spent moving weights for it; `after_update(step)` the metrics due after the update
    and the seconds spent loading the new weights; `pending(step)` the batches sampled ahead, for
    its checkpoint; `settled(step)` the metrics to report before that checkpoint; `finish(step)`
    those owed at the end; `close()` ends the run's threads, `release()` the processes and files
    (safe to call twice). `reload_seconds`: the last weight load's seconds in the sampler.
    """

    reload_seconds: float

    def prepare(self, trainer: Trainer, base: torch.nn.Module) -> None: ...

    def before_sharding(self, trainer: Trainer) -> None: ...

    def setup(self, trainer: Trainer) -> None: ...

    def start(self) -> dict[int, dict[str, float]]: ...

    def next_batch(self, step: int) -> tuple[RolloutBatch, float]: ...

    def after_update(self, step: int) -> tuple[dict[int, dict[str, float]], float]: ...

    def pending(self, step: int) -> list[RolloutBatch]: ...

    def settled(self, step: int) -> dict[int, dict[str, float]]: ...

    def finish(self, last_step: int) -> dict[int, dict[str, float]]: ...

    def close(self) -> None: ...

    def release(self) -> None: ...
