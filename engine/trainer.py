"""The GRPO training loop: sample groups, score them, step the policy, report, checkpoint.

One process per job holds the trainer and a rollout backend. With overlap on
(`max_off_policy_steps` ≥ 1 and `EngineConfig.overlap`), the rollouts of step n+1 are sampled
in a background thread by a copy of the policy from before step n while step n trains, so
they are one step off-policy; the loss corrects with the importance ratio against the
sampler's log-probabilities and `mismatch_kl/mean` reports the gap. Without overlap every
batch is sampled by the current policy.

Steps are numbered from 1: step n applies the n-th optimizer update, its metrics carry
`step = n`, and the checkpoint taken after it has step n. Everything random is derived from
the spec's seed and the step number (examples, sampling), so a resumed run reproduces an
uninterrupted one on CPU.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine import checkpoints as ckpt
from engine.catalog import TINY_RANDOM_LLAMA_ID
from engine.distributed import DataParallel
from engine.environments import Environment, load_environment
from engine.grpo import group_advantages, grpo_loss, token_logprobs_and_entropy
from engine.models import context_length, huggingface_dir, load_model, stop_token_ids
from engine.policy import (
    completion_logits,
    is_lora,
    make_trainable,
    pack_rollouts,
    policy_weights,
    rollout_policy,
    trainable_parameters,
)
from engine.reporter import Reporter
from engine.rollout import Completion, TransformersBackend

if TYPE_CHECKING:
    # Only a type: the trainer reads the spec's attributes and runs where pydantic is absent
    # (bench/gpu_check.sh on a bare GPU machine).
    from labsdk.spec import JobSpec

logger = logging.getLogger("engine")

_EVAL_SEED_OFFSET = 1 << 40


@dataclass(frozen=True)
class EngineConfig:
    """What the trainer runs with: the validated job spec plus the engine's own settings.

    `spec` is a `labsdk.spec.JobSpec` (docs/spec.md): every training setting and
    its default live there, once, and the trainer reads them from it. The rest are engine
    settings that no spec names: `overlap` (sample step n+1 while step n trains, when
    max_off_policy_steps ≥ 1), `micro_batch_rollouts` (rollouts per forward/backward pass;
    bounds memory), `clip_epsilon` (PPO ε), `max_grad_norm` (global L2 clip),
    `samples_per_step` (rollout samples reported per step), `rollout_backend`
    ("transformers", or "vllm": vLLM's CPU build here, its CUDA build on GPU pods),
    `vllm_dtype` (vLLM's compute dtype; the trainer stays fp32 on CPU and the importance
    ratio corrects for the difference), `device` ("auto": CUDA when present),
    `skip_equal_reward_groups` (skip the forward and backward passes of groups whose gradient
    is exactly zero; off only to measure throughput).
    """

    spec: JobSpec
    overlap: bool = False
    micro_batch_rollouts: int = 16
    clip_epsilon: float = 0.2
    max_grad_norm: float = 1.0
    samples_per_step: int = 8
    rollout_backend: str = "transformers"
    vllm_dtype: str = "bfloat16"
    device: str = "auto"
    skip_equal_reward_groups: bool = True

    def digest(self) -> str:
        """Hash the settings that change the training trajectory (not max_steps or reporting).

        The hash is stored in each checkpoint; a resume with other settings logs a warning.
        """
        spec = self.spec
        data = {
            "model": spec.model,
            "envs": [(env.id, dict(env.args)) for env in spec.env],
            "batch_size": spec.batch_size,
            "rollouts_per_example": spec.rollouts_per_example,
            "learning_rate": spec.learning_rate,
            "lora_rank": spec.lora_rank,
            "lora_alpha": spec.lora_alpha,
            "seed": spec.seed,
            "max_tokens": spec.sampling.max_tokens,
            "temperature": spec.sampling.temperature,
            "clip_epsilon": self.clip_epsilon,
            "max_grad_norm": self.max_grad_norm,
        }
        if spec.loss == "sft":  # only then, so that GRPO checkpoints keep their digest
            data["teacher"] = [spec.teacher.model, spec.teacher.endpoint().base_url]
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def use_overlap(self) -> bool:
        """Whether rollouts of the next step are sampled while this one trains."""
        return self.overlap and self.spec.max_off_policy_steps >= 1


@dataclass
class RolloutBatch:
    """The scored rollouts of one step: G prompts × K completions (K = rollouts_per_example).

    `policy_version` is how many optimizer updates the sampling policy had seen;
    `rewards` and `functions` (per reward function) are per rollout, prompt by prompt.
    """

    step: int
    policy_version: int
    env_indices: list[int]
    prompts: list[list[int]]
    completions: list[Completion]
    texts: list[str]
    rewards: list[float]
    functions: list[dict[str, float]]
    generate_seconds: float


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

    def setup(self) -> None:
        """Load the model and environments, wrap the policy, build optimizer and rollout backend.

        Raises engine.models.ModelNotFound and environments.InvalidEnvironment (exit 2 upstream).
        """
        config, spec = self.config, self.config.spec
        self.environments: list[Environment] = [
            load_environment(env.id, dict(env.args), spec.seed) for env in spec.env
        ]
        self.device = torch.device(config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        # fp32 on CPU (exact resumes, no bf16 units there); bf16 base weights on GPU, with
        # peft keeping the LoRA weights themselves in fp32.
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        base, self.tokenizer = load_model(spec.model, self.model_dir, dtype=dtype)
        base.to(self.device)
        # vLLM loads the base weights from disk, before LoRA wraps the model's layers in place.
        rollout_model_dir = huggingface_dir(spec.model, base, self.model_dir, self.workdir) if config.rollout_backend == "vllm" else None
        torch.manual_seed(spec.seed)  # LoRA's A matrices are initialised from the torch RNG
        self.model = make_trainable(base, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, base_model_id=spec.model)
        self.parameters = trainable_parameters(self.model)
        for _, parameter in self.parameters:
            # Zero (not None) gradients: AdamW then steps every parameter every step, as the
            # full-batch algorithm does, even when all groups had equal rewards.
            parameter.grad = torch.zeros_like(parameter)
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.parameters], lr=spec.learning_rate, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
        )
        self.stop_token_ids = stop_token_ids(base, self.tokenizer)
        if config.rollout_backend == "vllm":
            self.rollout_backend = self._vllm_backend(rollout_model_dir, context_length(base))
        else:
            # LoRA samples from a merged copy (fast); full fine-tuning samples from the
            # trainer's own model unless overlap needs a second copy (made in run()).
            self.rollout_backend = TransformersBackend(
                rollout_policy(self.model) if is_lora(self.model) else self.model,
                pad_token_id=self.tokenizer.pad_token_id, stop_token_ids=self.stop_token_ids,
            )
            logger.info("rollout backend: transformers (%s, torch threads %d)", self.device.type, torch.get_num_threads())
        self.start_step = 1
        self.pending_batch: RolloutBatch | None = None
        self.format = ckpt.FORMAT_LORA if is_lora(self.model) else ckpt.FORMAT_FULL
        self.checkpoint_root = self.workdir / "checkpoints"
        self.env_names = [env.name for env in self.environments]
        self.teacher = None
        if spec.loss == "sft":
            from engine.distill import TeacherClient

            self.teacher = TeacherClient.from_spec(spec.teacher)
            if spec.teacher.endpoint().check_model:
                self.teacher.check_model()
            self.context_length = context_length(base)
            self.end_token_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.stop_token_ids[0]
            logger.info("distilling from %s at %s", spec.teacher.model, self.teacher.base_url)

    def _vllm_backend(self, path: pathlib.Path, max_model_len: int):
        """Start vLLM on the base model's Hugging Face directory `path`."""
        from engine.vllm_backend import VLLMBackend

        spec = self.config.spec
        backend = VLLMBackend(
            path, seed=spec.seed, max_model_len=max_model_len, stop_token_ids=self.stop_token_ids,
            workdir=self.workdir, dtype=self.config.vllm_dtype,
        )
        logger.info(
            "rollout backend: vllm (%s, %s, start-up %.1fs%s)", path.name, self.config.vllm_dtype, backend.startup_seconds,
            "".join(f", {name}={value}" for name, value in backend.environment.items()),
        )
        return backend

    def close(self) -> None:
        """Release the rollout backend's processes and files (vLLM's engine); safe to call twice."""
        close = getattr(getattr(self, "rollout_backend", None), "close", None)
        if close is not None:
            close()
        if getattr(self, "teacher", None) is not None:
            self.teacher.close()

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
        self.pending_batch = pending
        logger.info("resumed from %s at step %d", checkpoint_dir, state.step)

    # ---- rollouts ----

    def _prompt_ids(self, env: Environment, index: int, split: str) -> tuple[list[int], object]:
        example = env.example(index, split)
        ids = self.tokenizer.apply_chat_template(example.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids), example

    def _generate_batch(self, step: int, policy_version: int, backend) -> RolloutBatch:
        """Sample and score the rollouts of `step` (examples and seed derived from seed and step)."""
        spec = self.config.spec
        started = time.perf_counter()
        groups = spec.batch_size // spec.rollouts_per_example
        env_indices, prompts, examples = [], [], []
        for slot in range(groups):
            index = (step - 1) * groups + slot
            env_index = index % len(self.environments)
            ids, example = self._prompt_ids(self.environments[env_index], index, "train")
            env_indices.append(env_index)
            prompts.append(ids)
            examples.append(example)
        completions = backend.generate(
            prompts, n=spec.rollouts_per_example, max_tokens=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature_at(step, spec.max_steps), seed=(spec.seed << 20) + step,
        )
        versions = {completion.policy_version for completion in completions}
        if versions != {policy_version}:
            raise RuntimeError(f"step {step}: rollouts from policy versions {sorted(versions)}, expected {policy_version}")
        texts, rewards, functions = [], [], []
        for row, completion in enumerate(completions):
            group = row // spec.rollouts_per_example
            text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            scores = self.environments[env_indices[group]].score(text, examples[group])
            texts.append(text)
            rewards.append(scores.reward)
            functions.append(scores.functions)
        return RolloutBatch(
            step=step, policy_version=policy_version, env_indices=env_indices, prompts=prompts,
            completions=completions, texts=texts, rewards=rewards, functions=functions,
            generate_seconds=time.perf_counter() - started,
        )

    # ---- training ----

    def _train_on(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """One optimizer update on a scored batch; return loss/entropy/kl/grad-norm metrics.

        Groups whose advantages are all zero are skipped: their loss terms and gradients are
        exactly zero, but their tokens still count in the token-level average.
        """
        config, spec = self.config, self.config.spec
        group_size = spec.rollouts_per_example
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        total_tokens = sum(len(c.token_ids) for c in batch.completions)
        # Under torchrun each rank trains on its share of the groups (engine/distributed.py).
        active = self.parallel.shard([
            g for g in range(len(batch.prompts))
            if not config.skip_equal_reward_groups or bool(advantages[g * group_size:(g + 1) * group_size].abs().sum() > 0)
        ])
        groups_per_pass = max(1, config.micro_batch_rollouts // group_size)
        loss_total, entropy_sum, kl_sum, token_count = 0.0, 0.0, 0.0, 0.0
        for chunk_start in range(0, len(active), groups_per_pass):
            chunk = active[chunk_start:chunk_start + groups_per_pass]
            rows = [g * group_size + k for g in chunk for k in range(group_size)]
            packed = pack_rollouts(
                [batch.prompts[g] for g in chunk], [batch.completions[r].token_ids for r in rows],
                group_size, self.tokenizer.pad_token_id,
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
        self.parallel.sum_gradients([p for _, p in self.parameters])
        loss_total, entropy_sum, kl_sum, token_count = self.parallel.sum([loss_total, entropy_sum, kl_sum, token_count])
        grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in self.parameters], config.max_grad_norm)
        self.optimizer.step()
        metrics = {"loss/mean": loss_total, "optim/grad_norm": float(grad_norm), "optim/lr": spec.learning_rate,
                   "sampling/temperature": spec.sampling.temperature_at(batch.step, spec.max_steps)}
        if token_count:
            metrics["entropy/mean"] = entropy_sum / token_count
            metrics["mismatch_kl/mean"] = kl_sum / token_count
        return metrics

    def _evaluate(self, step: int) -> dict[str, float]:
        """Mean reward of the current policy on `eval_num_examples` held-out examples per environment."""
        spec = self.config.spec
        results = {}
        for env in self.environments:
            prompts, examples = [], []
            for index in range(spec.eval.num_examples):
                ids, example = self._prompt_ids(env, index, "eval")
                prompts.append(ids)
                examples.append(example)
            completions = self.rollout_backend.generate(
                prompts, n=1, max_tokens=spec.sampling.max_tokens, temperature=spec.sampling.temperature,
                seed=(spec.seed << 20) + _EVAL_SEED_OFFSET,
            )
            rewards = [
                env.score(self.tokenizer.decode(c.token_ids, skip_special_tokens=True), example).reward
                for c, example in zip(completions, examples)
            ]
            results[f"eval/{env.name}/mean"] = sum(rewards) / len(rewards)
        return results

    def _step_metrics(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        rewards = torch.tensor(batch.rewards, dtype=torch.float64)
        group_size = self.config.spec.rollouts_per_example
        metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std(unbiased=False))}
        for env_index, env in enumerate(self.environments):
            rows = [r for r in range(len(batch.rewards)) if batch.env_indices[r // group_size] == env_index]
            if not rows:
                continue
            metrics[f"reward/{env.name}/mean"] = sum(batch.rewards[r] for r in rows) / len(rows)
            for function in env.rubric:
                metrics[f"reward/{env.name}/{function.name}/mean"] = sum(batch.functions[r][function.name] for r in rows) / len(rows)
        lengths = [len(batch.prompts[r // group_size]) + len(c.token_ids) for r, c in enumerate(batch.completions)]
        metrics["seq_len/mean"] = sum(lengths) / len(lengths)
        metrics["is_truncated/mean"] = sum(c.truncated for c in batch.completions) / len(batch.completions)
        return metrics

    def _samples(self, batch: RolloutBatch, advantages: torch.Tensor) -> list[dict]:
        group_size = self.config.spec.rollouts_per_example
        samples = []
        for row in range(min(self.config.samples_per_step, len(batch.completions))):
            group = row // group_size
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

    # ---- distillation (loss = "sft", engine/distill.py) ----

    def _teacher_batch(self, step: int, policy_version: int, backend=None) -> RolloutBatch:
        """Ask the teacher for the completions of `step`'s prompts (the examples a GRPO step
        would take) and score them; `backend` is unused (the teacher samples)."""
        from engine.distill import teacher_token_ids

        spec = self.config.spec
        sampling = spec.teacher.sampling
        started = time.perf_counter()
        groups = spec.batch_size // spec.rollouts_per_example
        requests = []
        for slot in range(groups):
            index = (step - 1) * groups + slot
            env_index = index % len(self.environments)
            ids, example = self._prompt_ids(self.environments[env_index], index, "train")
            requests.append((index, env_index, ids, example))
        max_tokens = (sampling.max_tokens if sampling and sampling.max_tokens else None) or spec.sampling.max_tokens
        temperature = sampling.temperature if sampling and sampling.temperature is not None else spec.sampling.temperature_at(step, spec.max_steps)
        extra = dict(sampling.extra_body or {}) if sampling else {}
        if sampling and sampling.enable_thinking is not None:
            extra["chat_template_kwargs"] = {**extra.get("chat_template_kwargs", {}), "enable_thinking": sampling.enable_thinking}
        if sampling and sampling.reasoning_effort is not None:
            extra["reasoning_effort"] = sampling.reasoning_effort

        def ask(request):
            index, _, _, example = request
            return self.teacher.complete(
                example.messages, n=spec.rollouts_per_example, max_tokens=max_tokens, temperature=temperature,
                seed=(spec.seed << 20) + index, extra_body=extra,
            )

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, groups), thread_name_prefix="teacher") as pool:
            answers = list(pool.map(ask, requests))
        completions, texts, rewards, functions = [], [], [], []
        for (_, env_index, ids, example), answer in zip(requests, answers):
            room = max(0, min(max_tokens, self.context_length - len(ids)))
            for teacher_completion in answer:
                token_ids = teacher_token_ids(self.tokenizer, teacher_completion, end_token_id=self.end_token_id, max_tokens=room)
                completions.append(Completion(token_ids=token_ids, logprobs=[], truncated=not teacher_completion.finished,
                                              policy_version=policy_version))
                scores = self.environments[env_index].score(teacher_completion.text, example)
                texts.append(teacher_completion.text)
                rewards.append(scores.reward)
                functions.append(scores.functions)
        return RolloutBatch(
            step=step, policy_version=policy_version, env_indices=[r[1] for r in requests], prompts=[r[2] for r in requests],
            completions=completions, texts=texts, rewards=rewards, functions=functions,
            generate_seconds=time.perf_counter() - started,
        )

    def _train_sft(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """One optimizer update on the teacher's completions with the SFT loss
        (engine.distill.sft_loss); `advantages` is unused."""
        from engine.distill import sft_loss

        config, spec = self.config, self.config.spec
        group_size = spec.rollouts_per_example
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        total_tokens = max(1, sum(len(c.token_ids) for c in batch.completions))
        groups_per_pass = max(1, config.micro_batch_rollouts // group_size)
        loss_total, entropy_sum, token_count = 0.0, 0.0, 0.0
        groups = self.parallel.shard(range(len(batch.prompts)))
        for first in range(0, len(groups), groups_per_pass):
            chunk = groups[first:first + groups_per_pass]
            rows = [g * group_size + k for g in chunk for k in range(group_size)]
            packed = pack_rollouts(
                [batch.prompts[g] for g in chunk], [batch.completions[r].token_ids for r in rows], group_size, self.tokenizer.pad_token_id,
            )
            logits = completion_logits(self.model, packed)
            logprobs, entropy = token_logprobs_and_entropy(logits, packed.completion_ids.to(logits.device), 1.0)
            mask = packed.completion_mask.to(logprobs.device)
            loss = sft_loss(logprobs, mask, num_tokens=total_tokens)
            loss.backward()
            loss_total += float(loss.detach())
            entropy_sum += float((entropy.detach() * mask).sum())
            token_count += float(mask.sum())
        self.parallel.sum_gradients([p for _, p in self.parameters])
        loss_total, entropy_sum, token_count = self.parallel.sum([loss_total, entropy_sum, token_count])
        grad_norm = torch.nn.utils.clip_grad_norm_([p for _, p in self.parameters], config.max_grad_norm)
        self.optimizer.step()
        metrics = {"loss/mean": loss_total, "optim/grad_norm": float(grad_norm), "optim/lr": spec.learning_rate}
        if token_count:
            metrics["entropy/mean"] = entropy_sum / token_count
        return metrics

    # ---- checkpoints ----

    def _checkpoint(self, step: int, pending: RolloutBatch | None, metrics: dict[str, float] | None = None) -> pathlib.Path:
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
            state=ckpt.TrainerState(step=step, data_position=step * (spec.batch_size // spec.rollouts_per_example),
                                    seed=spec.seed, spec_digest=self.config.digest(), format=self.format),
            pending_rollouts=pending, card=card,
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

    def _adapter(self, step: int, metrics: dict[str, float]) -> None:
        """Export the adapter artifact of `step` (`[adapters]`: the weights alone, no optimizer or
        trainer state; engine.checkpoints.save_adapter) and queue it for Lab."""
        spec = self.config.spec
        root = self.workdir / ckpt.ADAPTER_ROOT
        card = ckpt.model_card(
            base_model=spec.model, job_id=self.reporter.job_id, step=step, max_steps=spec.max_steps,
            metrics=metrics, spec=spec.model_dump(mode="json", exclude_none=True),
            checkpoint_format=self.format, test_model=spec.model == TINY_RANDOM_LLAMA_ID,
        )
        directory = ckpt.save_adapter(root / ckpt.checkpoint_name(step), model=self.model, tokenizer=self.tokenizer, card=card)
        archive = directory.with_name(directory.name + ".tar")
        size, digest = ckpt.write_tar(directory, archive)
        self.reporter.adapter(step, self.format, archive, size, digest)
        ckpt.prune_adapters(root, keep=self.reporter.pending_archives(adapters=True))
        logger.info("adapter step %d: %s (%d bytes, sha256 %s)", step, archive.name, size, digest[:12])

    def _load_policy(self, version: int) -> float:
        """Load the trainer's current weights into the rollout backend as policy `version`
        (optimizer updates seen); return the seconds it took."""
        started = time.perf_counter()
        self.rollout_backend.load_weights(policy_weights(self.model), policy_version=version)
        return time.perf_counter() - started

    @staticmethod
    def _off_policy_metrics(step: int, batch: RolloutBatch) -> dict[str, float]:
        """`off_policy/steps_mean` and `_max`: how many optimizer updates behind the policy
        that trains at `step` (step - 1 updates) each rollout's sampling policy was."""
        lags = [step - 1 - completion.policy_version for completion in batch.completions]
        return {"off_policy/steps_mean": sum(lags) / len(lags), "off_policy/steps_max": float(max(lags))}

    def _stop_requested(self) -> bool:
        return self.stop_event.is_set() or self.reporter.stop_requested.is_set()

    # ---- the loop ----

    def run(self) -> str:
        """Train from `start_step` to `max_steps`; return "succeeded", or "stopped" after a
        checkpoint when a stop was requested (SIGTERM or Lab's `action: stop`)."""
        config, spec = self.config, self.config.spec
        executor = None
        if config.use_overlap:
            if getattr(self.rollout_backend, "model", None) is self.model:
                self.rollout_backend = TransformersBackend(
                    rollout_policy(self.model), pad_token_id=self.tokenizer.pad_token_id, stop_token_ids=self.stop_token_ids
                )
            executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts")
        distilling = spec.loss == "sft"
        generate_batch = self._teacher_batch if distilling else self._generate_batch
        train_on = self._train_sft if distilling else self._train_on
        pending: concurrent.futures.Future | None = None
        if self.pending_batch is not None:
            pending = concurrent.futures.Future()
            pending.set_result(self.pending_batch)
        self.reporter.set_status("running", self.start_step - 1, f"rollout backend: {config.rollout_backend}")
        if self._stop_requested():
            return "stopped"
        step = self.start_step - 1
        try:
            for step in range(self.start_step, spec.max_steps + 1):
                step_started = time.perf_counter()
                weights_seconds = 0.0
                if pending is None:
                    weights_seconds += self._load_policy(step - 1)
                    batch = generate_batch(step, step - 1, self.rollout_backend)
                else:
                    batch = pending.result()
                    pending = None
                wait_seconds = time.perf_counter() - step_started - weights_seconds
                if executor is not None and step < spec.max_steps:
                    weights_seconds += self._load_policy(step - 1)
                    pending = executor.submit(generate_batch, step + 1, step - 1, self.rollout_backend)
                rewards = torch.tensor(batch.rewards, dtype=torch.float32)
                # Distillation trains on every teacher token alike: no advantages.
                advantages = torch.zeros_like(rewards) if distilling else group_advantages(rewards, spec.rollouts_per_example)
                train_started = time.perf_counter()
                train_metrics = train_on(batch, advantages)
                train_seconds = time.perf_counter() - train_started
                metrics = self._step_metrics(batch, advantages)
                metrics.update(train_metrics)
                if spec.eval.interval and step % spec.eval.interval == 0:
                    if pending is not None:
                        pending.result()  # the sampler is free, and its weights can move to this step's
                    weights_seconds += self._load_policy(step)
                    metrics.update(self._evaluate(step))
                step_seconds = time.perf_counter() - step_started
                tokens = sum(len(batch.prompts[r // spec.rollouts_per_example]) + len(c.token_ids) for r, c in enumerate(batch.completions))
                completion_tokens = sum(len(c.token_ids) for c in batch.completions)
                metrics.update({
                    "time/step": step_seconds,
                    "time/generate": batch.generate_seconds,
                    "time/train": train_seconds,
                    "perf/tokens": float(tokens),
                    "perf/tokens_per_s": tokens / step_seconds if step_seconds > 0 else 0.0,
                    "perf/rollout_tokens_per_s": completion_tokens / batch.generate_seconds if batch.generate_seconds > 0 else 0.0,
                    "perf/rollout_backend_vllm": 1.0 if config.rollout_backend == "vllm" else 0.0,
                    "perf/weight_reload_s": float(getattr(self.rollout_backend, "reload_seconds", 0.0)),
                    "perf/train_tokens_per_s": tokens / train_seconds if train_seconds > 0 else 0.0,
                    "time/wait_for_batch": wait_seconds,
                    "time/wait_for_weights": weights_seconds,
                    **self._off_policy_metrics(step, batch),
                })
                self.reporter.metrics(step, metrics)
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
                if stopping or step == spec.max_steps or (spec.checkpoints.interval and step % spec.checkpoints.interval == 0):
                    # The rollouts already sampled for the next step go into the checkpoint,
                    # so a resume trains on exactly what an uninterrupted run would.
                    next_batch = pending.result() if pending is not None else None
                    if self.parallel.is_main:
                        self._checkpoint(step, next_batch, metrics)
                if self.parallel.is_main and ckpt.adapter_due(spec.adapters, step, spec.max_steps):
                    self._adapter(step, metrics)
                if stopping:
                    logger.info("stop requested: stopped after step %d with a checkpoint", step)
                    return "stopped"
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
            if executor is not None:
                executor.shutdown(wait=True)
        return "succeeded"
