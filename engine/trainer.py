"""The GRPO training loop: take scored batches, compute advantages, step the policy, report, checkpoint.

The trainer takes each step's batch from a rollout source: its own orchestrator in this
process (`InProcessRollouts`, engine/orchestrator.py, sampling here or through an inference
role over HTTP), or the orchestrator role over a shared directory (`engine.roles.
SharedDirRollouts`, `python -m engine trainer`). With overlap on (`max_off_policy_steps` = k ≥ 1
and `EngineConfig.overlap`), the batches of up to `async_depth` future steps are sampled while
the trainer trains: while step n trains, the batches of steps up to n + depth are sampled by
the policy from before step n (n - 1 updates), so a batch is at most k updates old (prime-rl's
bounded off-policy asynchrony, `max_async_level`); the loss corrects with the importance ratio
against the sampler's log-probabilities and `mismatch_kl/mean`, `off_policy/steps_mean` and
`_max` report the gap. `max_inflight_rollouts` (or `oversampling_factor`) bounds the depth by
the rollouts it allows in flight. Without overlap every batch is sampled by the current policy.

Steps are numbered from 1: step n applies the n-th optimizer update, its metrics carry
`step = n`, and the checkpoint taken after it has step n. Everything random is derived from
the spec's seed and the step number (examples, sampling), so a resumed run reproduces an
uninterrupted one on CPU.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import os
import pathlib
import threading
import time
from dataclasses import dataclass, field

import torch

from engine import checkpoints as ckpt
from engine.catalog import TINY_RANDOM_LLAMA_ID
from engine.config import EngineConfig
from engine.distributed import DataParallel, full_optimizer_state, full_weights, is_sharded, whole
from engine.filters import Rollouts, apply_filters, filter_metrics
from engine.groups import GroupSchedule, group_starts, row_groups, training_group_sizes, uniform_size
from engine.grpo import group_advantages, grpo_loss, token_logprobs_and_entropy
from engine.models import context_length, huggingface_dir, load_model, stop_token_ids
from engine.orchestrator import Orchestrator, RolloutBatch
from engine.policy import (
    completion_logits,
    is_lora,
    join_weight_gather,
    load_policy,
    make_trainable,
    pack_rollouts,
    policy_snapshot,
    rollout_policy,
    trainable_parameters,
)
from engine.reporter import Reporter
from engine.rollout import TransformersBackend
from engine.vllm_backend import VLLMBackend

logger = logging.getLogger("engine")



def micro_batches(groups: list[int], sizes: list[int], micro_batch_rollouts: int) -> list[list[int]]:
    """Split `groups` (indexes into `sizes`, the rollouts of each group) into the chunks of one
    forward/backward pass each, in order: as many whole groups as fit in `micro_batch_rollouts`
    rollouts, and a group larger than that alone. With one K throughout, every chunk but the
    last holds max(1, micro_batch_rollouts // K) groups."""
    chunks, rollouts = [], 0
    for group in groups:
        if not chunks or rollouts + sizes[group] > micro_batch_rollouts:
            chunks.append([])
            rollouts = 0
        chunks[-1].append(group)
        rollouts += sizes[group]
    return chunks


class StopTraining(Exception):
    """Raised inside the loop when a stop was requested (SIGTERM or Lab's `action: stop`)."""


@dataclass
class Trainer:
    """Runs one job: `setup()`, optionally `resume(dir)`, then `run()`."""

    config: EngineConfig
    workdir: pathlib.Path
    reporter: Reporter
    stop_event: threading.Event = field(default_factory=threading.Event)
    model_dir: pathlib.Path | None = None
    #: This process's rank under torchrun; rank 0 alone writes checkpoints and adapters.
    parallel: DataParallel = field(default_factory=DataParallel)
    #: The orchestrator role's process when this run started it (its exit ends the attempt).
    orchestrator_process: object = None

    def setup(self) -> None:
        """Load the model and environments, wrap the policy, build optimizer and rollout backend.

        Raises engine.models.ModelNotFound and environments.InvalidEnvironment (exit 2 upstream).
        """
        config, spec = self.config, self.config.spec
        self.device = torch.device(config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        # fp32 on CPU (exact resumes, no bf16 units there); bf16 base weights on GPU, with
        # peft keeping the LoRA weights themselves in fp32.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        base, self.tokenizer = load_model(spec.model, self.model_dir, dtype=dtype)
        base.to(self.device)
        # vLLM loads the base weights from disk, before LoRA wraps the model's layers in place.
        rollout_model_dir = huggingface_dir(spec.model, base, self.model_dir, self.workdir) if config.rollout_backend == "vllm" and not (config.inference or config.shared_dir) else None
        torch.manual_seed(spec.seed)  # LoRA's A matrices are initialised from the torch RNG
        self.model = make_trainable(base, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, base_model_id=spec.model)
        sampling_copy = None
        if self.parallel.world_size > 1 and not is_lora(self.model):
            # Full fine-tuning under torchrun shards the policy with FSDP2 (engine/distributed.py).
            # A sharded forward pass is a collective, and rank 0 evaluates alone: in-process
            # sampling runs on a plain copy taken now, loaded with the gathered weights per update.
            if not (config.shared_dir or config.inference) and config.rollout_backend != "vllm":
                sampling_copy = rollout_policy(self.model)
            self.model = self.parallel.shard_model(self.model, self.device)
        self.parameters = trainable_parameters(self.model)
        for _, parameter in self.parameters:
            # Zero (not None) gradients: AdamW then steps every parameter every step, as the
            # full-batch algorithm does, even when all groups had equal rewards.
            parameter.grad = torch.zeros_like(parameter)
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.parameters], lr=spec.learning_rate, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
        )
        self.stop_token_ids = stop_token_ids(base, self.tokenizer)
        backend = None  # stays None for the trainer role: the orchestrator role samples (engine/roles.py)
        if config.shared_dir:
            pass
        elif config.inference:
            backend = self._remote_backend()
        elif config.rollout_backend == "vllm":
            backend = self._vllm_backend(rollout_model_dir, context_length(base))
        else:
            # LoRA samples from a merged copy (fast); full fine-tuning samples from the
            # trainer's own model unless overlap needs a second copy (made in run()), or from
            # the copy taken before sharding.
            if sampling_copy is None:
                sampling_copy = rollout_policy(self.model) if is_lora(self.model) else self.model
            backend = TransformersBackend(
                sampling_copy,
                pad_token_id=self.tokenizer.pad_token_id, stop_token_ids=self.stop_token_ids,
            )
            logger.info("rollout backend: transformers (%s, torch threads %d)", self.device.type, torch.get_num_threads())
        self.start_step = 1
        #: Batches sampled ahead for the steps after start_step - 1 (restored by resume).
        self.pending_batches: list[RolloutBatch] = []
        self.format = ckpt.FORMAT_LORA if is_lora(self.model) else ckpt.FORMAT_FULL
        self.checkpoint_root = self.workdir / "checkpoints"
        #: Which groups each step samples (engine/groups.py): the checkpoints' data position.
        self.group_schedule = GroupSchedule.for_spec(spec)
        #: The rollout side in this process (None for the trainer role: engine/roles.py).
        self.orchestrator = None
        if not config.shared_dir:
            self.orchestrator = Orchestrator(config, self.tokenizer, self.stop_token_ids, context_length(base), backend=backend)
            self.orchestrator.setup()

    def _remote_backend(self):
        """Sample through an inference role (engine/remote_inference.py): the one at
        `config.inference`, or one started here for "process"."""
        from engine.remote_inference import HttpRolloutBackend, start_inference_role

        config = self.config
        process = None
        url = config.inference
        if url == "process":
            url, process = start_inference_role(
                config.spec.model, backend=config.rollout_backend, workdir=self.workdir / "inference",
                max_lora_rank=config.vllm_max_lora_rank,
            )
        shm = pathlib.Path("/dev/shm")
        root = pathlib.Path(config.weights_dir) if config.weights_dir else (shm if shm.is_dir() else self.workdir)
        try:
            return HttpRolloutBackend(
                url, model_id=config.spec.model, process=process,
                weights_dir=root / f"lab-weights-{self.reporter.job_id}-{self.reporter.attempt}-{os.getpid()}",
            )
        except BaseException:
            if process is not None:
                process.kill()
            raise

    def _vllm_backend(self, path: pathlib.Path, max_model_len: int):
        """Start vLLM on the base model's Hugging Face directory `path`."""
        spec = self.config.spec
        backend = VLLMBackend(
            path, seed=spec.seed, max_model_len=max_model_len, stop_token_ids=self.stop_token_ids,
            workdir=self.workdir, dtype=self.config.vllm_dtype,
            max_lora_rank=self.config.vllm_max_lora_rank,
        )
        logger.info(
            "rollout backend: vllm (%s, %s, weights: %s, start-up %.1fs%s)", path.name, self.config.vllm_dtype,
            f"LoRA adapter, max_lora_rank {backend.max_lora_rank}" if backend.weights_format == "lora" else "merged",
            backend.startup_seconds,
            "".join(f", {name}={value}" for name, value in backend.environment.items()),
        )
        return backend

    def close(self) -> None:
        """Release the rollout backend's processes and files (vLLM's engine); safe to call twice."""
        close = getattr(getattr(getattr(self, "orchestrator", None), "backend", None), "close", None)
        if close is not None:
            close()
        if getattr(self, "orchestrator", None) is not None:
            self.orchestrator.close()

    def initialize_from(self, checkpoint_dir: pathlib.Path) -> None:
        """Start from another job's checkpoint: its weights (or adapter) only.

        Unlike `resume`, the optimizer is fresh, training starts at step 1 and examples and
        sampling follow this job's seed. Raises ValueError when the checkpoint does not fit the
        model (other base model, LoRA vs full, other rank).
        """
        state = ckpt.load_weights(checkpoint_dir, model=self.model, base_model_id=self.config.spec.model)
        logger.info("initialised from %s (its step %d); training starts at step 1", checkpoint_dir, state.step)

    def resume(self, checkpoint_dir: pathlib.Path) -> None:
        """Continue from a checkpoint directory: weights, optimizer, RNG, next step, pending rollouts."""
        state, pending = ckpt.restore_checkpoint(checkpoint_dir, model=self.model, optimizer=self.optimizer)
        if state.spec_digest != self.config.digest():
            logger.warning("resuming from a checkpoint written with different training settings")
        self.start_step = state.step + 1
        # A checkpoint holds the batches sampled ahead: a list, or one batch (older checkpoints).
        self.pending_batches = [] if pending is None else (list(pending) if isinstance(pending, list) else [pending])
        logger.info("resumed from %s at step %d", checkpoint_dir, state.step)

    # ---- training ----

    def _train_on(self, batch: RolloutBatch, advantages: torch.Tensor, keep: list[bool] | None = None) -> dict[str, float]:
        """One optimizer update on a scored batch; return loss/entropy/kl/grad-norm metrics.

        `keep`: per rollout, whether it is still in the batch after the filters (default all).
        Dropped rollouts are out of the loss but their tokens still count in the token-level
        average's denominator (every sampled completion token of the batch; a multi-turn
        rollout's environment tokens, `Completion.loss_mask` 0, never count), so a step in which few
        groups carry signal takes a proportionally smaller step; measured on the main job
        (bench/engine_learning.py), averaging over the kept tokens only left its 5-step mean reward
        at 0.51 after 20 steps against 0.66 this way. A group with none left is not run at all.
        """
        config, spec = self.config, self.config.spec
        sizes = batch.rollouts_per_group(spec.rollouts_per_example)
        starts = group_starts(sizes)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        keep = [True] * len(batch.completions) if keep is None else keep
        total_tokens = sum(c.sampled_count for c in batch.completions)
        # Under torchrun each rank trains on its share of the groups (engine/distributed.py).
        active = self.parallel.shard([g for g in range(len(batch.prompts)) if any(keep[starts[g]:starts[g + 1]])])
        loss_total, entropy_sum, kl_sum, token_count = 0.0, 0.0, 0.0, 0.0
        chunks = micro_batches(active, sizes, config.micro_batch_rollouts)
        passes = self._passes(len(chunks))
        for chunk in chunks:
            rows = [r for g in chunk for r in range(starts[g], starts[g + 1])]
            packed = self._pack(
                [batch.prompts[g] for g in chunk], [batch.completions[r].token_ids for r in rows],
                [sizes[g] for g in chunk], [batch.completions[r].loss_mask for r in rows],
            )
            sampling_logprobs = torch.zeros(packed.completion_ids.shape, dtype=torch.float32)
            for i, r in enumerate(rows):
                values = batch.completions[r].logprobs
                if values:
                    sampling_logprobs[i, : len(values)] = torch.tensor(values)
            logits = completion_logits(self.model, packed)
            logprobs, entropy = token_logprobs_and_entropy(
                logits, packed.completion_ids.to(logits.device), spec.sampling.temperature_at(batch.step, spec.max_steps)
            )
            mask = packed.completion_mask.to(logprobs.device)
            mask = mask * torch.tensor([keep[r] for r in rows], dtype=mask.dtype, device=mask.device).unsqueeze(-1)
            terms = grpo_loss(
                logprobs, sampling_logprobs.to(logprobs.device), advantages[rows].to(logprobs.device), mask,
                clip_epsilon=config.clip_epsilon, num_tokens=max(total_tokens, 1),
            )
            terms.loss.backward()
            tokens = float(mask.sum())
            loss_total += float(terms.loss.detach())
            entropy_sum += float((entropy.detach() * mask).sum())
            kl_sum += terms.mismatch_kl * tokens
            token_count += tokens
        self._zero_weight_passes(batch, passes - len(chunks))
        if not is_sharded(self.model):  # FSDP2 has summed them in its reduce-scatters
            self.parallel.sum_gradients([p for _, p in self.parameters])
        loss_total, entropy_sum, kl_sum, token_count = self.parallel.sum([loss_total, entropy_sum, kl_sum, token_count])
        grad_norm = whole(torch.nn.utils.clip_grad_norm_([p for _, p in self.parameters], config.max_grad_norm))
        self.optimizer.step()
        metrics = {"loss/mean": loss_total, "optim/grad_norm": float(grad_norm), "optim/lr": spec.learning_rate,
                   "sampling/temperature": spec.sampling.temperature_at(batch.step, spec.max_steps)}
        if token_count:
            metrics["entropy/mean"] = entropy_sum / token_count
            metrics["mismatch_kl/mean"] = kl_sum / token_count
        return metrics

    def _pack(self, prompts: list[list[int]], completions: list[list[int]], sizes: list[int],
              loss_masks: list[list[int] | None] | None = None):
        """`pack_rollouts` with the tokenizer's pad token. For a sharded model the completions are
        at least 2 columns wide (a padding column out of the loss if need be), so that every
        pass runs the model twice (prompts, then completions: engine.policy.completion_logits)
        and every rank runs the same collectives."""
        packed = pack_rollouts(prompts, completions, sizes, self.tokenizer.pad_token_id, loss_masks)
        if is_sharded(self.model) and packed.completion_ids.shape[1] < 2:
            packed.completion_ids = torch.cat(
                [packed.completion_ids, torch.full_like(packed.completion_ids, self.tokenizer.pad_token_id)], dim=1)
            packed.completion_mask = torch.cat([packed.completion_mask, torch.zeros_like(packed.completion_mask)], dim=1)
        return packed

    def _passes(self, chunks: int) -> int:
        """How many forward/backward passes this step runs on this rank, for `chunks` micro-batches
        of its own: for a sharded model the most any rank has (asked of all before the first
        pass: FSDP2's all-gathers and reduce-scatters are collectives, and ranks differ in
        micro-batches when their shares of the groups differ in size or in zero-advantage groups
        left out); otherwise `chunks`."""
        return self.parallel.maximum(chunks) if is_sharded(self.model) else chunks

    def _zero_weight_passes(self, batch: RolloutBatch, count: int) -> None:
        """Run `count` forward/backward passes that change no gradient, so that this rank runs as
        many as the others (`_passes`): each runs the batch's first group and back-propagates its
        logits times 0, adding exact zeros to the gradients."""
        sizes = batch.rollouts_per_group(self.config.spec.rollouts_per_example)
        for _ in range(count):
            packed = self._pack([batch.prompts[0]], [c.token_ids for c in batch.completions[: sizes[0]]], [sizes[0]])
            (completion_logits(self.model, packed).sum() * 0.0).backward()

    def _filtered_advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, list[bool], dict[str, float]]:
        """Run the spec's pre-batch filters, the group advantages over the rollouts they keep,
        then the post-batch filters (engine.filters); return the advantages, the keep mask
        and the `filter/<type>/fraction` metrics. A timed-out rollout (`Completion.timed_out`:
        past its `[[env]] timeout`, scored nothing) is never kept: as verifiers gives a timed-out
        episode no trace to train on, it is out of its group's advantages and of the loss."""
        spec = self.config.spec
        sizes = batch.rollouts_per_group(spec.rollouts_per_example)
        group_size = uniform_size(sizes) or sizes  # one K: the fixed-size path
        rollouts = Rollouts(
            rewards=batch.rewards, token_ids=[c.sampled_token_ids() for c in batch.completions],
            logprobs=[c.sampled_logprobs() for c in batch.completions], texts=batch.texts, group_size=group_size,
        )
        scored = [not completion.timed_out for completion in batch.completions]
        keep, flagged = apply_filters(spec.batch_filters("pre_batch_filters"), rollouts, scored)
        advantages = group_advantages(
            torch.tensor(batch.rewards, dtype=torch.float32), group_size, keep=torch.tensor(keep),
        )
        keep, flagged_after = apply_filters(spec.batch_filters("post_batch_filters"), rollouts, keep)
        for kind, rows in flagged_after.items():
            flagged.setdefault(kind, set()).update(rows)
        return advantages, keep, filter_metrics(flagged, len(batch.rewards))

    def _step_metrics(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        rewards = torch.tensor(batch.rewards, dtype=torch.float64)
        sizes = batch.rollouts_per_group(self.config.spec.rollouts_per_example)
        group_of = row_groups(sizes)
        metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False))}
        # Batches of checkpoints written before they carried names: the environments' ids.
        names = batch.env_names or [env.id for env in self.config.spec.env]
        mixed = uniform_size(training_group_sizes(self.config.spec)) is None
        for env_index, name in enumerate(names):
            rows = [r for r in range(len(batch.rewards)) if batch.env_indices[group_of[r]] == env_index]
            if not rows:
                continue
            if mixed:  # blocks of different group sizes: what each took of the batch
                groups = [g for g, env in enumerate(batch.env_indices) if env == env_index]
                metrics[f"batch/{name}/groups"] = float(len(groups))
                metrics[f"batch/{name}/rollouts_per_group"] = len(rows) / len(groups)
            metrics[f"reward/{name}/mean"] = sum(batch.rewards[r] for r in rows) / len(rows)
            for function in batch.functions[rows[0]]:
                metrics[f"reward/{name}/{function}/mean"] = sum(batch.functions[r][function] for r in rows) / len(rows)
        lengths = [len(batch.prompts[group_of[r]]) + len(c.token_ids) for r, c in enumerate(batch.completions)]
        metrics["seq_len/mean"] = sum(lengths) / len(lengths)
        metrics["is_truncated/mean"] = sum(c.truncated for c in batch.completions) / len(batch.completions)
        # Reported by jobs that set an [[env]] timeout, and on any step a rollout timed out.
        timed_out = [c.timed_out for c in batch.completions]
        if any(timed_out) or any(env.timeout is not None for env in self.config.spec.env):
            metrics["is_timeout/mean"] = sum(timed_out) / len(timed_out)
        return metrics

    def _samples(self, batch: RolloutBatch, advantages: torch.Tensor) -> list[dict]:
        group_of = row_groups(batch.rollouts_per_group(self.config.spec.rollouts_per_example))
        samples = []
        for row in range(min(self.config.samples_per_step, len(batch.completions))):
            group = group_of[row]
            samples.append({
                "step": batch.step,
                "group": group,
                "prompt": self.tokenizer.decode(batch.prompts[group], skip_special_tokens=False),
                "completion": batch.texts[row],
                "reward": batch.rewards[row],
                "advantage": float(advantages[row]),
                "metrics": batch.functions[row],
            })
        return samples

    def _train_sft(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """One optimizer update on the teacher's completions with the SFT loss
        (engine.distill.sft_loss); `advantages` is unused."""
        from engine.distill import sft_loss

        config, spec = self.config, self.config.spec
        sizes = batch.rollouts_per_group(spec.rollouts_per_example)
        starts = group_starts(sizes)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        total_tokens = max(1, sum(len(c.token_ids) for c in batch.completions))
        loss_total, entropy_sum, token_count = 0.0, 0.0, 0.0
        groups = self.parallel.shard(range(len(batch.prompts)))
        chunks = micro_batches(list(groups), sizes, config.micro_batch_rollouts)
        passes = self._passes(len(chunks))
        for chunk in chunks:
            rows = [r for g in chunk for r in range(starts[g], starts[g + 1])]
            packed = self._pack(
                [batch.prompts[g] for g in chunk], [batch.completions[r].token_ids for r in rows], [sizes[g] for g in chunk],
            )
            logits = completion_logits(self.model, packed)
            logprobs, entropy = token_logprobs_and_entropy(logits, packed.completion_ids.to(logits.device), 1.0)
            mask = packed.completion_mask.to(logprobs.device)
            loss = sft_loss(logprobs, mask, num_tokens=total_tokens)
            loss.backward()
            loss_total += float(loss.detach())
            entropy_sum += float((entropy.detach() * mask).sum())
            token_count += float(mask.sum())
        self._zero_weight_passes(batch, passes - len(chunks))
        if not is_sharded(self.model):  # FSDP2 has summed them in its reduce-scatters
            self.parallel.sum_gradients([p for _, p in self.parameters])
        loss_total, entropy_sum, token_count = self.parallel.sum([loss_total, entropy_sum, token_count])
        grad_norm = whole(torch.nn.utils.clip_grad_norm_([p for _, p in self.parameters], config.max_grad_norm))
        self.optimizer.step()
        metrics = {"loss/mean": loss_total, "optim/grad_norm": float(grad_norm), "optim/lr": spec.learning_rate}
        if token_count:
            metrics["entropy/mean"] = entropy_sum / token_count
        return metrics

    # ---- checkpoints ----

    def _checkpoint(self, step: int, pending: list[RolloutBatch] | None, metrics: dict[str, float] | None = None, *,
                    weights: dict[str, torch.Tensor] | None = None, optimizer_state: dict | None = None) -> pathlib.Path:
        """Write, archive and report the checkpoint of `step` (rank 0); `weights` and
        `optimizer_state`: a sharded model's, gathered by every rank (engine.distributed)."""
        self.reporter.set_status("checkpointing", step)
        spec = self.config.spec
        card = ckpt.model_card(
            base_model=spec.model, job_id=self.reporter.job_id, step=step, max_steps=spec.max_steps,
            metrics=metrics or {}, spec=spec.model_dump(mode="json", exclude_none=True),
            checkpoint_format=self.format, test_model=spec.model == TINY_RANDOM_LLAMA_ID,
        )
        directory = ckpt.save_checkpoint(
            self.checkpoint_root / ckpt.checkpoint_name(step),
            model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
            state=ckpt.TrainerState(step=step, data_position=self.group_schedule.first_index(step + 1),
                                    seed=spec.seed, spec_digest=self.config.digest(), format=self.format),
            pending_rollouts=pending, card=card, weights=weights, optimizer_state=optimizer_state,
        )
        archive = directory.with_name(directory.name + ".tar")
        size, digest = ckpt.write_tar(directory, archive)
        self.reporter.checkpoint(step, self.format, archive, size, digest)
        ckpt.prune_checkpoints(
            self.checkpoint_root, spec.checkpoints.keep_last, pending_archives=self.reporter.pending_archives()
        )
        logger.info("checkpoint step %d: %s (%d bytes, sha256 %s)", step, archive.name, size, digest[:12])
        self.reporter.set_status("running", step)
        return directory

    def _adapter(self, step: int, metrics: dict[str, float], *, weights: dict[str, torch.Tensor] | None = None) -> None:
        """Export the adapter artifact of `step` (`[adapters]`: the weights alone, no optimizer or
        trainer state; engine.checkpoints.save_adapter) and queue it for Lab; `weights`: a
        sharded model's, gathered by every rank."""
        spec = self.config.spec
        root = self.workdir / ckpt.ADAPTER_ROOT
        card = ckpt.model_card(
            base_model=spec.model, job_id=self.reporter.job_id, step=step, max_steps=spec.max_steps,
            metrics=metrics, spec=spec.model_dump(mode="json", exclude_none=True),
            checkpoint_format=self.format, test_model=spec.model == TINY_RANDOM_LLAMA_ID,
        )
        directory = ckpt.save_adapter(root / ckpt.checkpoint_name(step), model=self.model, tokenizer=self.tokenizer, card=card,
                                      weights=weights)
        archive = directory.with_name(directory.name + ".tar")
        size, digest = ckpt.write_tar(directory, archive)
        self.reporter.adapter(step, self.format, archive, size, digest)
        ckpt.prune_adapters(root, keep=self.reporter.pending_archives(adapters=True))
        logger.info("adapter step %d: %s (%d bytes, sha256 %s)", step, archive.name, size, digest[:12])

    @staticmethod
    def _off_policy_metrics(step: int, batch: RolloutBatch) -> dict[str, float]:
        """`off_policy/steps_mean` and `_max`: how many optimizer updates behind the policy
        that trains at `step` (step - 1 updates) each rollout's sampling policy was."""
        lags = [step - 1 - completion.policy_version for completion in batch.completions]
        return {"off_policy/steps_mean": sum(lags) / len(lags), "off_policy/steps_max": float(max(lags))}

    def _stop_requested(self) -> bool:
        return self.stop_event.is_set() or self.reporter.stop_requested.is_set()

    # ---- the loop ----

    def _rollouts(self):
        """Where this run's batches come from: its own orchestrator (this process), or an
        orchestrator role over the shared directory `config.shared_dir` (engine/roles.py)."""
        if self.config.shared_dir:
            from engine.roles import SharedDirRollouts

            return SharedDirRollouts(self)
        return InProcessRollouts(self)

    def _report_held_out(self, results: dict[int, dict[str, float]]) -> None:
        """Report eval/val metrics that arrived for steps already reported (merged into their points)."""
        for step, values in sorted(results.items()):
            if values:
                self.reporter.metrics(step, values)

    def run(self) -> str:
        """Train from `start_step` to `max_steps`; return "succeeded", or "stopped" after a
        checkpoint when a stop was requested (SIGTERM or Lab's `action: stop`)."""
        config, spec = self.config, self.config.spec
        distilling = spec.loss == "sft"
        self.rollouts = rollouts = self._rollouts()
        self.reporter.set_status("running", self.start_step - 1, f"rollout backend: {config.rollout_backend}")
        outcome = "succeeded"
        step = self.start_step - 1
        try:
            if self._stop_requested():
                return "stopped"
            # The base model's eval is step 0's point (prime-rl's skip_first_step = false).
            self._report_held_out(rollouts.start())
            for step in range(self.start_step, spec.max_steps + 1):
                step_started = time.perf_counter()
                batch, weights_seconds = rollouts.next_batch(step)
                wait_seconds = time.perf_counter() - step_started - weights_seconds
                rewards = torch.tensor(batch.rewards, dtype=torch.float32)
                train_started = time.perf_counter()
                if distilling:  # distillation trains on every teacher token alike: no advantages, no filters
                    advantages = torch.zeros_like(rewards)
                    train_metrics, filter_values = self._train_sft(batch, advantages), {}
                else:
                    advantages, keep, filter_values = self._filtered_advantages(batch)
                    train_metrics = self._train_on(batch, advantages, keep)
                train_seconds = time.perf_counter() - train_started
                metrics = self._step_metrics(batch, advantages)
                metrics.update(train_metrics)
                metrics.update(filter_values)
                held_out, seconds = rollouts.after_update(step)
                weights_seconds += seconds
                metrics.update(held_out.pop(step, {}))
                step_seconds = time.perf_counter() - step_started
                group_of = row_groups(batch.rollouts_per_group(spec.rollouts_per_example))
                tokens = sum(len(batch.prompts[group_of[r]]) + len(c.token_ids) for r, c in enumerate(batch.completions))
                completion_tokens = sum(c.sampled_count for c in batch.completions)
                metrics.update({
                    "time/step": step_seconds,
                    "time/generate": batch.generate_seconds,
                    "time/train": train_seconds,
                    "perf/tokens": float(tokens),
                    "perf/tokens_per_s": tokens / step_seconds if step_seconds > 0 else 0.0,
                    "perf/rollout_tokens_per_s": completion_tokens / batch.generate_seconds if batch.generate_seconds > 0 else 0.0,
                    "perf/rollout_backend_vllm": 1.0 if config.rollout_backend == "vllm" else 0.0,
                    "perf/weight_reload_s": float(rollouts.reload_seconds),
                    "perf/train_tokens_per_s": tokens / train_seconds if train_seconds > 0 else 0.0,
                    "time/wait_for_batch": wait_seconds,
                    "time/wait_for_weights": weights_seconds,
                    **self._off_policy_metrics(step, batch),
                })
                self.reporter.metrics(step, metrics)
                self._report_held_out(held_out)
                self.reporter.samples(self._samples(batch, advantages))
                logger.info(
                    "step %d/%d reward %.3f loss %.4f entropy %s time %.1fs (generate %.1fs%s, train %.1fs)",
                    step, spec.max_steps, metrics["reward/mean"], metrics["loss/mean"],
                    f"{metrics['entropy/mean']:.3f}" if "entropy/mean" in metrics else "-",
                    step_seconds, batch.generate_seconds,
                    f", waited {wait_seconds:.1f}s" if batch.policy_version < step - 1 else "", train_seconds,
                )
                self.reporter.set_status("running", step)
                stopping = self.parallel.any(self._stop_requested()) and step < spec.max_steps
                checkpoint_due = stopping or step == spec.max_steps or (spec.checkpoints.interval and step % spec.checkpoints.interval == 0)
                adapter_due = ckpt.adapter_due(spec.adapters, step, spec.max_steps)
                # A sharded model's full state is gathered by every rank; rank 0 alone writes it.
                weights = full_weights(self.model) if is_sharded(self.model) and (checkpoint_due or adapter_due) else None
                if checkpoint_due:
                    # The rollouts already sampled for the next steps go into the checkpoint,
                    # so a resume trains on exactly what an uninterrupted run would.
                    next_batches = rollouts.pending(step)
                    # The evals up to this step are reported before its checkpoint: a resume owes none of them.
                    self._report_held_out(rollouts.settled(step))
                    optimizer_state = full_optimizer_state(self.model, self.optimizer) if is_sharded(self.model) else None
                    if self.parallel.is_main:
                        self._checkpoint(step, next_batches or None, metrics, weights=weights, optimizer_state=optimizer_state)
                if self.parallel.is_main and adapter_due:
                    self._adapter(step, metrics, weights=weights)
                if stopping:
                    logger.info("stop requested: stopped after step %d with a checkpoint", step)
                    outcome = "stopped"
                    break
            self._report_held_out(rollouts.finish(step))
        finally:
            rollouts.close()
        return outcome


class InProcessRollouts:
    """The batches of a run sampled by the trainer's own orchestrator, in its process.

    With overlap a rollout thread samples the batches of up to `config.async_depth` future
    steps while the trainer trains: while step n trains, the batches of steps up to n + depth
    are sampled by a copy of the policy from before step n (n - 1 updates), so a batch is at
    most `max_off_policy_steps` updates old. Evals and validations run on rank 0 alone, which
    alone reports.
    """

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        config = trainer.config
        self.orchestrator = orchestrator = trainer.orchestrator
        self.executor = None
        if config.use_overlap:
            if getattr(orchestrator.backend, "model", None) is trainer.model:
                orchestrator.backend = TransformersBackend(
                    rollout_policy(trainer.model), pad_token_id=trainer.tokenizer.pad_token_id, stop_token_ids=trainer.stop_token_ids
                )
            self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts")
        self.depth = config.async_depth
        # (step, future batch) of the steps sampled ahead, oldest first.
        self.ahead: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
        for restored in trainer.pending_batches:
            future = concurrent.futures.Future()
            future.set_result(restored)
            self.ahead.append((restored.step, future))

    @property
    def reload_seconds(self) -> float:
        """The last weight load's seconds in the rollout backend (0 for transformers)."""
        return getattr(self.orchestrator.backend, "reload_seconds", 0.0)

    def start(self) -> dict[int, dict[str, float]]:
        """The base model's eval (as step 0), when a fresh run's `[eval]` asks for it."""
        trainer = self.trainer
        if trainer.start_step == 1 and self.orchestrator.held_out_due(0):
            if trainer.parallel.is_main:
                self._load_policy(0)
                return {0: self.orchestrator.held_out(0)}
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
        for _, future in self.ahead:
            future.cancel()
        if self.executor is not None:
            self.executor.shutdown(wait=True)
