"""The GRPO training loop: take scored batches, compute advantages, step the policy, report, checkpoint.

The trainer takes each step's batch from the rollout source its entry point hands it
(engine.rollout_source.RolloutSource): an orchestrator in this process (engine.colocated.InProcessRollouts,
sampling here or through an inference role over HTTP), or the orchestrator role over a shared
directory (engine.trainer_role.SharedDirRollouts, `python -m engine trainer`). With overlap on (`max_off_policy_steps` = k ≥ 1
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

import logging
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine import checkpoints as ckpt
from engine.catalog import TINY_RANDOM_MODEL_IDS
from engine.checkpoint_archives import write_tar
from engine.config import EngineConfig
from engine.distributed import DataParallel, full_optimizer_state, full_weights, is_sharded, whole
from engine.filters import Rollouts, apply_filters, filter_metrics
from engine.groups import GroupSchedule, group_starts, micro_batches, row_groups, training_group_sizes, uniform_size
from engine.grpo import group_advantages, grpo_loss, sft_loss, token_logprobs_and_entropy
from engine.models import context_length, load_model, stop_token_ids
from engine.policy import (
    completion_logits,
    is_lora,
    make_trainable,
    pack_rollouts,
    trainable_parameters,
)
from engine.reporter import Reporter
from engine.routing import RouterStatistics
from engine.step_log import step_line

if TYPE_CHECKING:
    from engine.orchestrator import RolloutBatch
    from engine.rollout_source import RolloutSource

logger = logging.getLogger("engine")


class StopTraining(Exception):
    """Raised inside the loop when a stop was requested (SIGTERM or Lab's `action: stop`)."""


@dataclass
class Trainer:
    """Runs one job: `setup()`, optionally `resume(dir)`, then `run()`."""

    config: EngineConfig
    workdir: pathlib.Path
    reporter: Reporter
    #: Where the batches come from (engine.colocated.InProcessRollouts, engine.trainer_role.SharedDirRollouts).
    rollouts: RolloutSource
    stop_event: threading.Event = field(default_factory=threading.Event)
    model_dir: pathlib.Path | None = None
    #: This process's rank under torchrun; rank 0 alone writes checkpoints and adapters.
    parallel: DataParallel = field(default_factory=DataParallel)

    def setup(self) -> None:
        """Load the model, wrap the policy, build the optimizer; then set the rollout source up
        (`RolloutSource`: an orchestrator in this process loads the environments and starts its
        sampler). Raises engine.models.ModelNotFound and environments.InvalidEnvironment (exit 2 upstream).
        """
        config, spec = self.config, self.config.spec
        self.device = torch.device(config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        # fp32 on CPU (exact resumes, no bf16 units there); bf16 base weights on GPU, with
        # peft keeping the LoRA weights themselves in fp32.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        base, self.tokenizer = load_model(spec.model, self.model_dir, dtype=dtype)
        base.to(self.device)
        self.stop_token_ids = stop_token_ids(base, self.tokenizer)
        self.context_length = context_length(base)
        self.rollouts.prepare(self, base)  # before LoRA wraps the model's layers in place
        torch.manual_seed(spec.seed)  # LoRA's A matrices are initialised from the torch RNG
        self.model = make_trainable(base, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, base_model_id=spec.model)
        if self.parallel.world_size > 1 and not is_lora(self.model):
            # Full fine-tuning under torchrun shards the policy with FSDP2 (engine/distributed.py).
            # A sharded forward pass is a collective: a rollout source that samples with the
            # policy takes its plain copy now.
            self.rollouts.before_sharding(self)
            self.model = self.parallel.shard_model(self.model, self.device)
        self.parameters = trainable_parameters(self.model)
        #: A mixture of experts' routing, reported as `moe/*` metrics (None for a dense model).
        self.routing = RouterStatistics.attach(self.model)
        for _, parameter in self.parameters:
            # Zero (not None) gradients: AdamW then steps every parameter every step, as the
            # full-batch algorithm does, even when all groups had equal rewards.
            parameter.grad = torch.zeros_like(parameter)
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.parameters], lr=spec.learning_rate, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
        )
        self.start_step = 1
        #: Batches sampled ahead for the steps after start_step - 1 (restored by resume).
        self.pending_batches: list[RolloutBatch] = []
        self.format = ckpt.FORMAT_LORA if is_lora(self.model) else ckpt.FORMAT_FULL
        self.checkpoint_root = self.workdir / "checkpoints"
        #: Which groups each step samples (engine/groups.py): the checkpoints' data position.
        self.group_schedule = GroupSchedule.for_spec(spec)
        self.rollouts.setup(self)

    def close(self) -> None:
        """Release the rollout source's processes and files (vLLM's engine, an inference role); safe to call twice."""
        self.rollouts.release()

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
            logits = completion_logits(self.model, packed, self.routing)
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
        if self.routing is not None:
            metrics.update(self.routing.metrics(self.parallel))
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
        (engine.grpo.sft_loss); `advantages` is unused."""
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
            logits = completion_logits(self.model, packed, self.routing)
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
        if self.routing is not None:
            metrics.update(self.routing.metrics(self.parallel))
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
            checkpoint_format=self.format, test_model=spec.model in TINY_RANDOM_MODEL_IDS,
        )
        directory = ckpt.save_checkpoint(
            self.checkpoint_root / ckpt.checkpoint_name(step),
            model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
            state=ckpt.TrainerState(step=step, data_position=self.group_schedule.first_index(step + 1),
                                    seed=spec.seed, spec_digest=self.config.digest(), format=self.format),
            pending_rollouts=pending, card=card, weights=weights, optimizer_state=optimizer_state,
        )
        archive = directory.with_name(directory.name + ".tar")
        size, digest = write_tar(directory, archive)
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
            checkpoint_format=self.format, test_model=spec.model in TINY_RANDOM_MODEL_IDS,
        )
        directory = ckpt.save_adapter(root / ckpt.checkpoint_name(step), model=self.model, tokenizer=self.tokenizer, card=card,
                                      weights=weights)
        archive = directory.with_name(directory.name + ".tar")
        size, digest = write_tar(directory, archive)
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
        rollouts = self.rollouts
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
                logger.info("%s", step_line(
                    step, spec.max_steps, metrics, step_seconds=step_seconds, generate_seconds=batch.generate_seconds,
                    train_seconds=train_seconds, waited_seconds=wait_seconds if batch.policy_version < step - 1 else None,
                ))
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
