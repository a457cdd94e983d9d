"""The rollout source of a trainer whose orchestrator runs in its own process (`python -m engine
run`, the default): `InProcessRollouts`, which the entry point hands the trainer.

Its orchestrator (engine/orchestrator.py) samples with one of three backends: transformers on a
merged copy of the trainer's policy (LoRA), the policy itself (full fine-tuning), or the copy
taken before sharding (torchrun); vLLM in this process (engine/vllm_backend.py); or an inference
role over HTTP (engine/remote_inference.py, `LAB_ENGINE_INFERENCE`). Each update's policy reaches
the sampler as the backend takes it (engine.policy.policy_snapshot).

With overlap a rollout thread samples the batches of up to `config.async_depth` future steps
while the trainer trains: while step n trains, the batches of steps up to n + depth are sampled
by a copy of the policy from before step n (n - 1 updates), so a batch is at most
`max_off_policy_steps` updates old. Evals and validations run on rank 0 alone, which alone reports.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import pathlib
import time
from typing import TYPE_CHECKING

import torch

from engine.environments import Environment
from engine.models import huggingface_dir
from engine.orchestrator import Orchestrator, RolloutBatch
from engine.policy import is_lora, join_weight_gather, load_policy, policy_snapshot, rollout_policy
from engine.remote_inference import HttpRolloutBackend, start_inference_role
from engine.rollout import TransformersBackend
from engine.vllm_backend import VLLMBackend

if TYPE_CHECKING:
    from engine.trainer import Trainer

logger = logging.getLogger("engine")


class InProcessRollouts:
    """The batches of a run sampled by an orchestrator in the trainer's process (engine.trainer.RolloutSource)."""

    def __init__(self, environments: list[Environment] | None = None) -> None:
        #: The training environments, when loaded before the model (engine.commands.run), else
        #: None: the orchestrator loads them.
        self.environments = environments
        self.trainer: Trainer | None = None
        #: The orchestrator, set up by `setup` (None before).
        self.orchestrator: Orchestrator | None = None
        self.executor = None
        self.depth = 0
        # (step, future batch) of the steps sampled ahead, oldest first.
        self.ahead: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
        self._model_path: pathlib.Path | None = None
        self._sampling_copy = None

    # ---- set-up, with the trainer's ----

    def prepare(self, trainer: Trainer, base: torch.nn.Module) -> None:
        """vLLM loads the base weights from disk, before LoRA wraps the model's layers in place."""
        config = trainer.config
        if config.rollout_backend == "vllm" and not config.inference:
            self._model_path = huggingface_dir(config.spec.model, base, trainer.model_dir, trainer.workdir)

    def before_sharding(self, trainer: Trainer) -> None:
        """A sharded forward pass is a collective, and rank 0 evaluates alone: transformers
        sampling here runs on a plain copy taken now, loaded with the gathered weights per update."""
        config = trainer.config
        if not config.inference and config.rollout_backend != "vllm":
            self._sampling_copy = rollout_policy(trainer.model)

    def setup(self, trainer: Trainer) -> None:
        """Start the sampler and set the orchestrator up (it loads the environments)."""
        self.trainer = trainer
        config = trainer.config
        if config.inference:
            backend = self._remote_backend()
        elif config.rollout_backend == "vllm":
            backend = self._vllm_backend(self._model_path, trainer.context_length)
        else:
            # LoRA samples from a merged copy (fast); full fine-tuning samples from the
            # trainer's own model unless overlap needs a second copy (made in start()), or from
            # the copy taken before sharding.
            sampling_copy = self._sampling_copy
            if sampling_copy is None:
                sampling_copy = rollout_policy(trainer.model) if is_lora(trainer.model) else trainer.model
            backend = TransformersBackend(
                sampling_copy, pad_token_id=trainer.tokenizer.pad_token_id, stop_token_ids=trainer.stop_token_ids,
            )
            logger.info("rollout backend: transformers (%s, torch threads %d)", trainer.device.type, torch.get_num_threads())
        self.orchestrator = Orchestrator(
            config, trainer.tokenizer, trainer.stop_token_ids, trainer.context_length, backend=backend,
            environments=list(self.environments or []),
        )
        self.orchestrator.setup()

    def _remote_backend(self) -> HttpRolloutBackend:
        """Sample through an inference role (engine/remote_inference.py): the one at
        `config.inference`, or one started here for "process"."""
        trainer = self.trainer
        config = trainer.config
        process = None
        url = config.inference
        if url == "process":
            url, process = start_inference_role(
                config.spec.model, backend=config.rollout_backend, workdir=trainer.workdir / "inference",
                max_lora_rank=config.vllm_max_lora_rank,
            )
        shm = pathlib.Path("/dev/shm")
        root = pathlib.Path(config.weights_dir) if config.weights_dir else (shm if shm.is_dir() else trainer.workdir)
        try:
            return HttpRolloutBackend(
                url, model_id=config.spec.model, process=process,
                weights_dir=root / f"lab-weights-{trainer.reporter.job_id}-{trainer.reporter.attempt}-{os.getpid()}",
            )
        except BaseException:
            if process is not None:
                process.kill()
            raise

    def _vllm_backend(self, path: pathlib.Path, max_model_len: int) -> VLLMBackend:
        """Start vLLM on the base model's Hugging Face directory `path`."""
        trainer = self.trainer
        config = trainer.config
        backend = VLLMBackend(
            path, seed=config.spec.seed, max_model_len=max_model_len, stop_token_ids=trainer.stop_token_ids,
            workdir=trainer.workdir, dtype=config.vllm_dtype, max_lora_rank=config.vllm_max_lora_rank,
        )
        logger.info(
            "rollout backend: vllm (%s, %s, weights: %s, start-up %.1fs%s)", path.name, config.vllm_dtype,
            f"LoRA adapter, max_lora_rank {backend.max_lora_rank}" if backend.weights_format == "lora" else "merged",
            backend.startup_seconds,
            "".join(f", {name}={value}" for name, value in backend.environment.items()),
        )
        return backend

    # ---- the run ----

    @property
    def reload_seconds(self) -> float:
        """The last weight load's seconds in the rollout backend (0 for transformers)."""
        return getattr(self.orchestrator.backend, "reload_seconds", 0.0)

    def start(self) -> dict[int, dict[str, float]]:
        """Take the batches a resume restored, start the rollout thread (overlap), and return the
        base model's eval (as step 0) when a fresh run's `[eval]` asks for it."""
        trainer = self.trainer
        config = trainer.config
        orchestrator = self.orchestrator
        if config.use_overlap:
            if getattr(orchestrator.backend, "model", None) is trainer.model:
                orchestrator.backend = TransformersBackend(
                    rollout_policy(trainer.model), pad_token_id=trainer.tokenizer.pad_token_id, stop_token_ids=trainer.stop_token_ids
                )
            self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts")
        self.depth = config.async_depth
        for restored in trainer.pending_batches:
            future = concurrent.futures.Future()
            future.set_result(restored)
            self.ahead.append((restored.step, future))
        if trainer.start_step == 1 and orchestrator.held_out_due(0):
            if trainer.parallel.is_main:
                self._load_policy(0)
                return {0: orchestrator.held_out(0)}
            join_weight_gather(trainer.model)  # rank 0's load gathers a sharded model's weights
        return {}

    def next_batch(self, step: int) -> tuple[RolloutBatch, float]:
        """Return `step`'s batch and the seconds spent moving weights for it; schedule the
        batches of the steps ahead."""
        trainer, weights_seconds = self.trainer, 0.0
        if self.ahead and self.ahead[0][0] == step:
            batch = self.ahead.popleft()[1].result()
        else:
            weights_seconds += self._load_policy(step - 1)
            batch = self.orchestrator.batch(step, step - 1)
        if self.executor is not None:
            # Sample up to `depth` steps ahead with the policy that trains this step
            # (step - 1 updates): a batch for step s is then s - step updates old.
            first = self.ahead[-1][0] + 1 if self.ahead else step + 1
            for future_step in range(first, min(step + self.depth, trainer.config.spec.max_steps) + 1):
                snapshot_started = time.perf_counter()
                self.ahead.append((future_step, self._sample_ahead(future_step, step - 1)))
                weights_seconds += time.perf_counter() - snapshot_started
        return batch, weights_seconds

    def _load_policy(self, version: int) -> float:
        """Load the trainer's current policy into the rollout backend as policy `version`
        (optimizer updates seen), as the backend takes it (merged weights or a LoRA adapter,
        `engine.policy.policy_snapshot`); return the seconds it took."""
        started = time.perf_counter()
        backend = self.orchestrator.backend
        load_policy(backend, policy_snapshot(self.trainer.model, backend), version)
        return time.perf_counter() - started

    def _sample_ahead(self, step: int, version: int) -> concurrent.futures.Future:
        """Sample `step`'s batch in the rollout thread with the policy as it is now (`version`
        updates): its weights are copied here and loaded by that thread just before it samples,
        so the trainer may update its own meanwhile."""
        orchestrator = self.orchestrator
        snapshot = policy_snapshot(self.trainer.model, orchestrator.backend, copy_weights=True)

        def sample() -> RolloutBatch:
            load_policy(orchestrator.backend, snapshot, version)
            return orchestrator.batch(step, version)

        return self.executor.submit(sample)

    def after_update(self, step: int) -> tuple[dict[int, dict[str, float]], float]:
        """After `step`'s update: its eval/val metrics when due (with the new weights), and
        the seconds spent loading them."""
        trainer = self.trainer
        if not self.orchestrator.held_out_due(step):
            return {}, 0.0
        if not trainer.parallel.is_main:
            join_weight_gather(trainer.model)  # rank 0's load gathers a sharded model's weights
            return {}, 0.0
        for _, future in self.ahead:
            future.result()  # the sampler is free, and its weights can move to this step's
        seconds = self._load_policy(step)
        return {step: self.orchestrator.held_out(step)}, seconds

    def pending(self, step: int) -> list[RolloutBatch]:
        """The batches sampled ahead of `step` (waiting for them), for its checkpoint."""
        return [future.result() for _, future in self.ahead]

    def settled(self, step: int) -> dict[int, dict[str, float]]:
        """Nothing: this process reports a step's evals with the step."""
        return {}

    def finish(self, last_step: int) -> dict[int, dict[str, float]]:
        """Nothing is left to collect in this process."""
        return {}

    def close(self) -> None:
        """End the rollout thread (the batches it has not sampled yet are dropped)."""
        for _, future in self.ahead:
            future.cancel()
        if self.executor is not None:
            self.executor.shutdown(wait=True)
            self.executor = None

    def release(self) -> None:
        """Release the rollout backend's processes and files (vLLM's engine, an inference role); safe to call twice."""
        orchestrator = self.orchestrator
        if orchestrator is None:
            return
        close = getattr(orchestrator.backend, "close", None)
        if close is not None:
            close()
        orchestrator.close()
