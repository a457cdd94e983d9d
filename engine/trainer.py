"""The GRPO training loop: sample groups, score them, step the policy, report, checkpoint.

One process per job holds the trainer and a rollout backend (in this process, or an
inference role over HTTP). With overlap on (`max_off_policy_steps` = k ≥ 1 and
`EngineConfig.overlap`), a rollout thread samples the batches of up to `async_depth` future
steps while the trainer trains: while step n trains, the batches of steps up to n + depth are
sampled by a copy of the policy from before step n (n - 1 updates), so a batch is at most k
updates old (prime-rl's bounded off-policy asynchrony, `max_async_level`); the loss corrects
with the importance ratio against the sampler's log-probabilities and `mismatch_kl/mean`,
`off_policy/steps_mean` and `_max` report the gap. `max_inflight_rollouts` (or
`oversampling_factor`) bounds the depth by the rollouts it allows in flight. Without overlap
every batch is sampled by the current policy.

Steps are numbered from 1: step n applies the n-th optimizer update, its metrics carry
`step = n`, and the checkpoint taken after it has step n. Everything random is derived from
the spec's seed and the step number (examples, sampling), so a resumed run reproduces an
uninterrupted one on CPU.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import os
import pathlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine import checkpoints as ckpt
from engine.catalog import TINY_RANDOM_LLAMA_ID
from engine.distributed import DataParallel
from engine.environments import Environment, load_environment
from engine.filters import Rollouts, apply_filters, filter_metrics
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
_VAL_SEED_OFFSET = 1 << 41
#: Prompts per sampling call of an eval or a validation (bounds memory on large splits).
_HELD_OUT_PROMPTS_PER_CALL = 64


def environment_index(index: int, ratios: list[float] | None, *, count: int, seed: int) -> int:
    """Return which of the `count` training environments the `index`-th group of the run
    (counted over all steps) samples from: round-robin when `ratios` is None, else (one ratio
    per environment, from `[[env]] ratio`, 1 where a block gives none) drawn with probability
    ratio / sum(ratios), as prime-rl mixes its environments. The draw is seeded by `seed` and
    `index` alone, so a resumed run draws exactly what an uninterrupted one does."""
    if ratios is None:
        return index % count
    return random.Random(f"lab-env-mix:{seed}:{index}").choices(range(count), weights=ratios)[0]


def extra_sampling(params: dict) -> dict:
    """Return the keyword arguments that carry `params` (vLLM SamplingParams fields) to a
    rollout backend's `generate`: none when empty, so the transformers backend is never given any."""
    return {"sampling_params": params} if params else {}


def template_variables(tokenizer) -> set[str] | None:
    """Return the variables the tokenizer's chat template reads (jinja2's
    `meta.find_undeclared_variables`), or None when it cannot be parsed."""
    template = tokenizer.chat_template
    if not isinstance(template, str):
        return None
    try:
        import jinja2
        from jinja2 import meta

        return set(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except Exception:  # a template jinja2's plain environment does not parse (transformers extensions)
        return None


def usable_template_kwargs(tokenizer, kwargs: dict, *, where: str, model: str) -> dict:
    """Return the entries of `kwargs` that the chat template reads; log a warning naming each
    one it does not (the prompt is then built without it). `where` is the spec section, for
    the message. A template that cannot be parsed gets the kwargs whose names it contains."""
    if not kwargs:
        return {}
    variables = template_variables(tokenizer)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    usable = {}
    for name, value in kwargs.items():
        if (name in variables) if variables is not None else (name in template):
            usable[name] = value
        else:
            logger.warning(
                "%s.%s: the chat template of %s does not use %r; prompts are built without it",
                where, name, model, name,
            )
    return usable


@dataclass(frozen=True)
class HeldOutTarget:
    """One environment an eval or a validation samples: `name` (in metric names),
    `num_examples` of `split` ("eval" or "val"), `rollouts_per_example` each."""

    environment: Environment
    name: str
    split: str
    num_examples: int
    rollouts_per_example: int


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
    `inference` (where rollouts are sampled: "" in this process; "process": an inference
    role this engine starts; or the base URL of a running one, engine/remote_inference.py),
    `weights_dir` (where weights for that role are written; "" = /dev/shm). Which rollouts
    are trained on is the spec's business (its batch filters, engine.filters).
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
    inference: str = ""
    weights_dir: str = ""

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
            "batch_filters": {
                slot: [[f.type, f.enforced, f.settings()] for f in spec.batch_filters(slot)]
                for slot in ("pre_batch_filters", "post_batch_filters")
            },
            "sampling_params": spec.sampling.sampling_params(),
            "chat_template_kwargs": spec.sampling.chat_template_kwargs(),
        }
        if any(env.ratio for env in spec.env):  # only then, so that older checkpoints keep their digest
            data["env_ratios"] = [env.ratio for env in spec.env]
        if spec.loss == "sft":  # only then, so that GRPO checkpoints keep their digest
            data["teacher"] = [spec.teacher.model, spec.teacher.endpoint().base_url]
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def use_overlap(self) -> bool:
        """Whether rollouts of the next step are sampled while this one trains."""
        return self.overlap and self.spec.max_off_policy_steps >= 1

    @property
    def async_depth(self) -> int:
        """How many future steps' batches are sampled ahead while the trainer trains (0 without
        overlap): at most `max_off_policy_steps`, so that a batch's policy is never more than
        that many updates old, and at most the batches that `max_inflight_rollouts` (or
        `oversampling_factor` × batch_size) rollouts make, but at least one."""
        if not self.use_overlap:
            return 0
        spec = self.spec
        depth = spec.max_off_policy_steps
        if spec.max_inflight_rollouts is not None:
            depth = min(depth, max(1, spec.max_inflight_rollouts // spec.batch_size))
        elif spec.oversampling_factor is not None:
            depth = min(depth, max(1, int(spec.oversampling_factor)))
        return depth


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
        rollout_model_dir = huggingface_dir(spec.model, base, self.model_dir, self.workdir) if config.rollout_backend == "vllm" and not config.inference else None
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
        if config.inference:
            self.rollout_backend = self._remote_backend()
        elif config.rollout_backend == "vllm":
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
        #: Batches sampled ahead for the steps after start_step - 1 (restored by resume).
        self.pending_batches: list[RolloutBatch] = []
        self.format = ckpt.FORMAT_LORA if is_lora(self.model) else ckpt.FORMAT_FULL
        self.checkpoint_root = self.workdir / "checkpoints"
        self.env_names = [env.name for env in self.environments]
        # [[env]] ratio: the training environments' shares of each batch (None: round-robin).
        self.env_ratios = [env.ratio or 1.0 for env in spec.env] if any(env.ratio for env in spec.env) else None
        self.template_kwargs = usable_template_kwargs(
            self.tokenizer, spec.sampling.chat_template_kwargs(), where="sampling", model=spec.model
        )
        if config.rollout_backend != "vllm" and (spec.sampling.sampling_params() or (spec.eval.sampling and spec.eval.sampling.sampling_params())):
            logger.warning("sampling.extra_body: the transformers rollout backend does not take vLLM sampling parameters; "
                           "they apply only with LAB_ENGINE_ROLLOUT=vllm")
        self.eval_targets = self._eval_targets()
        eval_sampling = spec.eval.sampling
        self.eval_template_kwargs = usable_template_kwargs(
            self.tokenizer, {**spec.sampling.chat_template_kwargs(), **(eval_sampling.chat_template_kwargs() if eval_sampling else {})},
            where="eval.sampling", model=spec.model,
        ) if eval_sampling else self.template_kwargs
        self.val_targets = [
            HeldOutTarget(env, env.name, "val", spec.val.setting("num_examples"), spec.val.setting("rollouts_per_example"))
            for env in self.environments
        ] if spec.val is not None else []
        self.teacher = None
        if spec.loss == "sft":
            from engine.distill import TeacherClient

            self.teacher = TeacherClient.from_spec(spec.teacher)
            if spec.teacher.endpoint().check_model:
                self.teacher.check_model()
            self.context_length = context_length(base)
            self.end_token_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.stop_token_ids[0]
            logger.info("distilling from %s at %s", spec.teacher.model, self.teacher.base_url)

    def _remote_backend(self):
        """Sample through an inference role (engine/remote_inference.py): the one at
        `config.inference`, or one started here for "process"."""
        from engine.remote_inference import HttpRolloutBackend, start_inference_role

        config = self.config
        process = None
        url = config.inference
        if url == "process":
            url, process = start_inference_role(config.spec.model, backend=config.rollout_backend, workdir=self.workdir / "inference")
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
        # A checkpoint holds the batches sampled ahead: a list, or one batch (older checkpoints).
        self.pending_batches = [] if pending is None else (list(pending) if isinstance(pending, list) else [pending])
        logger.info("resumed from %s at step %d", checkpoint_dir, state.step)

    # ---- rollouts ----

    def _prompt_ids(self, env: Environment, index: int, split: str, template_kwargs: dict | None = None) -> tuple[list[int], object]:
        """Return the prompt token ids and the example `index` of `split`; `template_kwargs` go
        to the chat template (default: the training sampling's, those the template uses)."""
        example = env.example(index, split)
        kwargs = self.template_kwargs if template_kwargs is None else template_kwargs
        ids = self.tokenizer.apply_chat_template(
            example.messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        return list(ids), example

    def _sampling_params(self, sampling) -> dict:
        """The extra vLLM SamplingParams of a sampling section (none on the transformers backend)."""
        return sampling.sampling_params() if self.config.rollout_backend == "vllm" else {}

    def _generate_batch(self, step: int, policy_version: int, backend) -> RolloutBatch:
        """Sample and score the rollouts of `step` (examples and seed derived from seed and step)."""
        spec = self.config.spec
        started = time.perf_counter()
        groups = spec.batch_size // spec.rollouts_per_example
        env_indices, prompts, examples = [], [], []
        for slot in range(groups):
            index = (step - 1) * groups + slot
            env_index = environment_index(index, self.env_ratios, count=len(self.environments), seed=spec.seed)
            ids, example = self._prompt_ids(self.environments[env_index], index, "train")
            env_indices.append(env_index)
            prompts.append(ids)
            examples.append(example)
        completions = backend.generate(
            prompts, n=spec.rollouts_per_example, max_tokens=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature_at(step, spec.max_steps), seed=(spec.seed << 20) + step,
            **extra_sampling(self._sampling_params(spec.sampling)),
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

    def _train_on(self, batch: RolloutBatch, advantages: torch.Tensor, keep: list[bool] | None = None) -> dict[str, float]:
        """One optimizer update on a scored batch; return loss/entropy/kl/grad-norm metrics.

        `keep`: per rollout, whether it is still in the batch after the filters (default all).
        Dropped rollouts are out of the loss but their tokens still count in the token-level
        average's denominator (every completion token of the batch), so a step in which few
        groups carry signal takes a proportionally smaller step; measured on the main job
        (bench/engine_learning.py), averaging over the kept tokens only left its 5-step mean reward
        at 0.51 after 20 steps against 0.66 this way. A group with none left is not run at all.
        """
        config, spec = self.config, self.config.spec
        group_size = spec.rollouts_per_example
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        keep = [True] * len(batch.completions) if keep is None else keep
        total_tokens = sum(len(c.token_ids) for c in batch.completions)
        # Under torchrun each rank trains on its share of the groups (engine/distributed.py).
        active = self.parallel.shard([g for g in range(len(batch.prompts)) if any(keep[g * group_size:(g + 1) * group_size])])
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

    def _eval_targets(self) -> list[HeldOutTarget]:
        """The environments each eval samples: the `[[eval.env]]` blocks (loaded here, with
        their own example counts and group sizes), else the training environments.

        `num_examples = -1` takes the environment's whole eval split (`Environment.eval_size`);
        a block without a count or group size takes `[eval]`'s (default 1 rollout per example).
        Two targets with one name get `_<n>` suffixes (n from 2) in their metric names.
        """
        spec = self.config.spec
        default_rollouts = spec.eval.rollouts_per_example or 1
        if spec.eval.env:
            blocks = [
                (load_environment(block.id, block.environment_args(self._environment_arguments(block.id)), spec.seed),
                 block.num_examples, block.rollouts_per_example or block.group_size)
                for block in spec.eval.env
            ]
        else:
            blocks = [(env, None, None) for env in self.environments]
        targets, seen = [], {}
        for env, count, rollouts in blocks:
            count = count if count is not None else spec.eval.num_examples
            seen[env.name] = seen.get(env.name, 0) + 1
            name = env.name if seen[env.name] == 1 else f"{env.name}_{seen[env.name]}"
            targets.append(HeldOutTarget(
                env, name, "eval", env.eval_size if count == -1 else count, rollouts or default_rollouts,
            ))
        return targets

    @staticmethod
    def _environment_arguments(env_id: str) -> set[str]:
        """The argument names environment `env_id` takes (none when it is not installed:
        load_environment then says so)."""
        from engine.catalog import list_environments

        info = list_environments().get(env_id)
        return set(info.args) if info else set()

    def _held_out(self, prefix: str, targets: list[HeldOutTarget], *, max_tokens: int, temperature: float,
                  seed: int, sampling_params: dict, template_kwargs: dict) -> dict[str, float]:
        """Sample and score every target with the current weights of the rollout backend;
        return `<prefix>/<name>/mean` (mean reward over all its rollouts) and
        `<prefix>/<name>/<function>/mean` per reward function."""
        results = {}
        for target in targets:
            env, rewards, functions = target.environment, [], {f.name: [] for f in target.environment.rubric}
            for first in range(0, target.num_examples, _HELD_OUT_PROMPTS_PER_CALL):
                indices = range(first, min(target.num_examples, first + _HELD_OUT_PROMPTS_PER_CALL))
                prompts, examples = [], []
                for index in indices:
                    ids, example = self._prompt_ids(env, index, target.split, template_kwargs)
                    prompts.append(ids)
                    examples.append(example)
                completions = self.rollout_backend.generate(
                    prompts, n=target.rollouts_per_example, max_tokens=max_tokens, temperature=temperature,
                    seed=seed + first, **extra_sampling(sampling_params),
                )
                for row, completion in enumerate(completions):
                    text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                    scores = env.score(text, examples[row // target.rollouts_per_example])
                    rewards.append(scores.reward)
                    for name, value in scores.functions.items():
                        functions.setdefault(name, []).append(value)
            results[f"{prefix}/{target.name}/mean"] = sum(rewards) / len(rewards)
            for name, values in functions.items():
                results[f"{prefix}/{target.name}/{name}/mean"] = sum(values) / len(values)
        return results

    def _evaluate(self, step: int) -> dict[str, float]:
        """Eval metrics of the current policy (`eval/<env>/mean`, `eval/<env>/<function>/mean`)
        on the eval split of each eval target, sampled with `[eval.sampling]` over `[sampling]`
        (temperature: the eval's, else the spec's base `sampling.temperature`). The same seed at
        every eval, so evals of successive policies see the same examples and draws."""
        spec = self.config.spec
        overrides = spec.eval.sampling
        max_tokens = (overrides.max_tokens if overrides else None) or spec.sampling.max_tokens
        temperature = overrides.temperature if overrides and overrides.temperature is not None else spec.sampling.temperature
        params = {**self._sampling_params(spec.sampling), **(self._sampling_params(overrides) if overrides else {})}
        return self._held_out(
            "eval", self.eval_targets, max_tokens=max_tokens, temperature=temperature,
            seed=(spec.seed << 20) + _EVAL_SEED_OFFSET, sampling_params=params, template_kwargs=self.eval_template_kwargs,
        )

    def _validate(self, step: int) -> dict[str, float]:
        """Validation metrics (`val/<env>/mean`, `val/<env>/<function>/mean`) of the current
        policy on the val split of each training environment, sampled as training samples at
        `step` (its max_tokens, temperature and options)."""
        spec = self.config.spec
        return self._held_out(
            "val", self.val_targets, max_tokens=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature_at(step, spec.max_steps), seed=(spec.seed << 20) + _VAL_SEED_OFFSET,
            sampling_params=self._sampling_params(spec.sampling), template_kwargs=self.template_kwargs,
        )

    def _filtered_advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, list[bool], dict[str, float]]:
        """Run the spec's pre-batch filters, the group advantages over the rollouts they keep,
        then the post-batch filters (engine.filters); return the advantages, the keep mask
        and the `filter/<type>/fraction` metrics."""
        spec = self.config.spec
        rollouts = Rollouts(
            rewards=batch.rewards, token_ids=[c.token_ids for c in batch.completions],
            logprobs=[c.logprobs for c in batch.completions], texts=batch.texts, group_size=spec.rollouts_per_example,
        )
        keep, flagged = apply_filters(spec.batch_filters("pre_batch_filters"), rollouts, [True] * len(batch.rewards))
        advantages = group_advantages(
            torch.tensor(batch.rewards, dtype=torch.float32), spec.rollouts_per_example, keep=torch.tensor(keep),
        )
        keep, flagged_after = apply_filters(spec.batch_filters("post_batch_filters"), rollouts, keep)
        for kind, rows in flagged_after.items():
            flagged.setdefault(kind, set()).update(rows)
        return advantages, keep, filter_metrics(flagged, len(batch.rewards))

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
            env_index = environment_index(index, self.env_ratios, count=len(self.environments), seed=spec.seed)
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

    def _checkpoint(self, step: int, pending: list[RolloutBatch] | None, metrics: dict[str, float] | None = None) -> pathlib.Path:
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

    def _sample_ahead(self, executor, generate_batch, step: int, version: int) -> concurrent.futures.Future:
        """Sample `step`'s batch in the rollout thread with the policy as it is now (`version`
        updates): its weights are copied here and loaded by that thread just before it samples,
        so the trainer may update its own meanwhile."""
        weights = [(name, tensor.clone()) for name, tensor in policy_weights(self.model)]

        def sample() -> RolloutBatch:
            self.rollout_backend.load_weights(weights, policy_version=version)
            return generate_batch(step, version, self.rollout_backend)

        return executor.submit(sample)

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
        depth = config.async_depth
        # (step, future batch) of the steps sampled ahead, oldest first.
        ahead: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
        for restored in self.pending_batches:
            future = concurrent.futures.Future()
            future.set_result(restored)
            ahead.append((restored.step, future))
        self.reporter.set_status("running", self.start_step - 1, f"rollout backend: {config.rollout_backend}")
        if self._stop_requested():
            return "stopped"
        if self.start_step == 1 and spec.eval.evaluates_base_model and self.parallel.is_main:
            # The base model's eval is step 0's point (prime-rl's skip_first_step = false);
            # evals and validations run on rank 0 alone, which alone reports.
            self._load_policy(0)
            self.reporter.metrics(0, self._evaluate(0))
        step = self.start_step - 1
        try:
            for step in range(self.start_step, spec.max_steps + 1):
                step_started = time.perf_counter()
                weights_seconds = 0.0
                if ahead and ahead[0][0] == step:
                    batch = ahead.popleft()[1].result()
                else:
                    weights_seconds += self._load_policy(step - 1)
                    batch = generate_batch(step, step - 1, self.rollout_backend)
                wait_seconds = time.perf_counter() - step_started - weights_seconds
                if executor is not None:
                    # Sample up to `depth` steps ahead with the policy that trains this step
                    # (step - 1 updates): a batch for step s is then s - step updates old.
                    first = ahead[-1][0] + 1 if ahead else step + 1
                    for future_step in range(first, min(step + depth, spec.max_steps) + 1):
                        snapshot_started = time.perf_counter()
                        ahead.append((future_step, self._sample_ahead(executor, generate_batch, future_step, step - 1)))
                        weights_seconds += time.perf_counter() - snapshot_started
                rewards = torch.tensor(batch.rewards, dtype=torch.float32)
                train_started = time.perf_counter()
                if distilling:  # distillation trains on every teacher token alike: no advantages, no filters
                    advantages = torch.zeros_like(rewards)
                    train_metrics, filter_values = train_on(batch, advantages), {}
                else:
                    advantages, keep, filter_values = self._filtered_advantages(batch)
                    train_metrics = self._train_on(batch, advantages, keep)
                train_seconds = time.perf_counter() - train_started
                metrics = self._step_metrics(batch, advantages)
                metrics.update(train_metrics)
                metrics.update(filter_values)
                evaluating = self.parallel.is_main and bool(spec.eval.interval) and step % spec.eval.interval == 0
                validating = (self.parallel.is_main and bool(self.val_targets) and bool(spec.val.setting("interval"))
                              and step % spec.val.setting("interval") == 0)
                if evaluating or validating:
                    for _, future in ahead:
                        future.result()  # the sampler is free, and its weights can move to this step's
                    weights_seconds += self._load_policy(step)
                    if evaluating:
                        metrics.update(self._evaluate(step))
                    if validating:
                        metrics.update(self._validate(step))
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
                    # The rollouts already sampled for the next steps go into the checkpoint,
                    # so a resume trains on exactly what an uninterrupted run would.
                    next_batches = [future.result() for _, future in ahead]
                    if self.parallel.is_main:
                        self._checkpoint(step, next_batches or None, metrics)
                if self.parallel.is_main and ckpt.adapter_due(spec.adapters, step, spec.max_steps):
                    self._adapter(step, metrics)
                if stopping:
                    logger.info("stop requested: stopped after step %d with a checkpoint", step)
                    return "stopped"
        finally:
            for _, future in ahead:
                future.cancel()
            if executor is not None:
                executor.shutdown(wait=True)
        return "succeeded"
