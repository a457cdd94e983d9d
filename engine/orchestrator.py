"""The orchestrator: environments, prompts, rollouts through a rollout backend, rewards, evals.

`Orchestrator` is the rollout side of a job. It loads the job's environments (user code, for
uploaded ones), builds each step's prompts from the spec's seed and the step, samples them
through a rollout backend (engine/rollout.py: in the trainer's process, vLLM, or an inference
role over HTTP), scores the completions with the environments' reward functions and returns
a `RolloutBatch`; it also runs the held-out evaluations (`[eval]`, `[val]`) and, for
`loss = "sft"`, asks the teacher. It holds no model weights: the trainer (engine/trainer.py)
turns batches into updates, and the two meet either in one process (`python -m engine run`)
or as separate roles over a shared directory (engine/roles.py, docs/engine.md "Three roles").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.catalog import list_environments
from engine.chat_templates import usable_template_kwargs
from engine.environments import Environment, InvalidEnvironment, load_environment
from engine.groups import GroupSchedule, environment_index, training_group_sizes  # noqa: F401 (environment_index: its public home was here)
from engine.multi_turn import complete_functions, group_rollouts, run_episodes
from engine.rollout import Completion

if TYPE_CHECKING:
    from engine.trainer import EngineConfig

logger = logging.getLogger("engine")

_EVAL_SEED_OFFSET = 1 << 40
_VAL_SEED_OFFSET = 1 << 41
#: Prompts per sampling call of an eval or a validation (bounds memory on large splits).
_HELD_OUT_PROMPTS_PER_CALL = 64


def block_names(names: list[str]) -> list[str]:
    """Return the metric names of environment blocks whose own names (an `[[env]] name`, else the
    environment's name) are `names`: a name given before gets `_<n>` (n from 2), so two blocks of
    one environment report apart (`reward/addition/mean`, `reward/addition_2/mean`)."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return unique


def extra_sampling(params: dict) -> dict:
    """Return the keyword arguments that carry `params` (vLLM SamplingParams fields) to a
    rollout backend's `generate`: none when empty, so the transformers backend is never given any."""
    return {"sampling_params": params} if params else {}


@dataclass(frozen=True)
class HeldOutTarget:
    """One environment an eval or a validation samples: `name` (in metric names),
    `num_examples` of `split` ("eval" or "val"), `rollouts_per_example` each."""

    environment: Environment
    name: str
    split: str
    num_examples: int
    rollouts_per_example: int


@dataclass
class RolloutBatch:
    """The scored rollouts of one step: G prompts, each with its group of completions.

    `policy_version` is how many optimizer updates the sampling policy had seen;
    `rewards` and `functions` (per reward function) are per rollout, prompt by prompt;
    `group_sizes`: the rollouts of each group (its `[[env]]` block's `group_size`, else
    `rollouts_per_example`); `rollouts_per_group` reads it.
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
    #: The training environments' names, by env index (None in checkpoints written before).
    env_names: list[str] | None = None
    #: Rollouts per group, group by group (None in checkpoints written before: all K).
    group_sizes: list[int] | None = None

    def rollouts_per_group(self, default: int) -> list[int]:
        """The rollouts of each group: `group_sizes`, or `default` (the spec's
        `rollouts_per_example`) for every group of a batch written before batches carried them."""
        return list(self.group_sizes) if self.group_sizes is not None else [default] * len(self.prompts)


#: The `[[env]]` keys that bound a multi-turn episode (engine/multi_turn.py).
EPISODE_LIMITS = ("max_turns", "max_input_tokens", "max_output_tokens")


def apply_block(environment: Environment, block) -> Environment:
    """Give `environment` what its `[[env]]` (or `[[eval.env]]`) block sets on its rollouts: the
    caps on a multi-turn episode's agents (`limits`), the retries of a failed rollout and the
    seconds its environment's part may take (`timeout`)."""
    environment.limits = {name: getattr(block, name, None) for name in EPISODE_LIMITS}
    environment.retries = block.rollout_retries
    environment.timeout = block.timeout
    return environment


def evaluates(spec, step: int) -> bool:
    """Whether `[eval]` runs for the policy after `step` updates (step 0: the base model)."""
    if step == 0:
        return spec.eval.evaluates_base_model
    return bool(spec.eval.interval) and step % spec.eval.interval == 0


def validates(spec, step: int) -> bool:
    """Whether `[val]` runs for the policy after `step` updates (never the base model)."""
    interval = spec.val.setting("interval") if spec.val is not None else 0
    return step > 0 and bool(interval) and step % interval == 0


def held_out_due(spec, step: int) -> bool:
    """Whether the policy after `step` updates is evaluated or validated: a function of the spec
    alone, so the trainer role knows which evals to wait for without loading environments."""
    return evaluates(spec, step) or validates(spec, step)


def load_training_environments(spec) -> list[Environment]:
    """The environments of the spec's `[[env]]` blocks, in order, each with what its block sets
    (`apply_block`). Raises environments.InvalidEnvironment for one that cannot be loaded."""
    return [apply_block(load_environment(env.id, dict(env.args), spec.seed), env) for env in spec.env]


@dataclass
class Orchestrator:
    """The rollout side of one job; `setup()` first. `backend` samples (set by the caller;
    it may be replaced between steps). Raises environments.InvalidEnvironment from setup."""

    config: "EngineConfig"
    tokenizer: object
    stop_token_ids: list[int]
    context_length: int
    backend: object = None
    environments: list[Environment] = field(default_factory=list)

    @property
    def spec(self):
        return self.config.spec

    def setup(self) -> None:
        """Load the training environments (unless given: `load_training_environments`), the eval
        and validation environments and the teacher (`loss = "sft"`)."""
        config, spec = self.config, self.config.spec
        self.environments = self.environments or load_training_environments(spec)
        self.env_names = block_names([block.name or env.name for env, block in zip(self.environments, spec.env)])
        # Which groups make each step: [[env]] ratio (the blocks' shares, else in turn) and
        # group_size (each block's rollouts per example), engine/groups.py.
        self.group_sizes = training_group_sizes(spec)
        self.schedule = GroupSchedule.for_spec(spec)
        if config.rollout_backend != "vllm" and (spec.sampling.sampling_params() or (spec.eval.sampling and spec.eval.sampling.sampling_params())):
            logger.warning("sampling.extra_body: the transformers rollout backend does not take vLLM sampling parameters; "
                           "they apply only with LAB_ENGINE_ROLLOUT=vllm")
        self.setup_eval()
        self.val_targets = [
            HeldOutTarget(env, name, "val", spec.val.setting("num_examples"), spec.val.setting("rollouts_per_example"))
            for env, name in zip(self.environments, self.env_names)
        ] if spec.val is not None else []
        self.teacher = None
        if spec.loss == "sft":
            multi_turn = [env.id for env in self.environments if env.multi_turn]
            if multi_turn:
                raise InvalidEnvironment(
                    f"environment {multi_turn[0]} is multi-turn, and loss = \"sft\" distils single completions; "
                    "train on it with GRPO"
                )
            from engine.distill import TeacherClient

            self.teacher = TeacherClient.from_spec(spec.teacher)
            if spec.teacher.endpoint().check_model:
                self.teacher.check_model()
            self.end_token_id = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.stop_token_ids[0]
            logger.info("distilling from %s at %s", spec.teacher.model, self.teacher.base_url)

    def setup_eval(self) -> None:
        """Load what `[eval]` samples: its targets (`_eval_targets`) and the chat template arguments
        of training and eval prompts. `setup` calls it; an evaluation run (engine/evaluation.py)
        calls it alone, as it trains on nothing and loads no training environment."""
        spec = self.spec
        self.template_kwargs = usable_template_kwargs(
            self.tokenizer, spec.sampling.chat_template_kwargs(), where="sampling", model=spec.model
        )
        eval_sampling = spec.eval.sampling
        self.eval_targets = self._eval_targets()
        self.eval_template_kwargs = usable_template_kwargs(
            self.tokenizer, {**spec.sampling.chat_template_kwargs(), **(eval_sampling.chat_template_kwargs() if eval_sampling else {})},
            where="eval.sampling", model=spec.model,
        ) if eval_sampling else self.template_kwargs

    def close(self) -> None:
        """Close the teacher's connections (the backend is its owner's to close)."""
        if getattr(self, "teacher", None) is not None:
            self.teacher.close()

    def batch(self, step: int, policy_version: int, backend=None) -> RolloutBatch:
        """The scored batch of `step`, sampled by policy `policy_version`: the teacher's for
        `loss = "sft"`, else the backend's (`backend`, default `self.backend`)."""
        if self.spec.loss == "sft":
            return self.teacher_batch(step, policy_version)
        return self.generate_batch(step, policy_version, backend)

    def held_out_due(self, step: int) -> bool:
        """Whether the policy after `step` updates is evaluated or validated (step 0: the base
        model's eval, when `[eval]` asks for it)."""
        return held_out_due(self.spec, step)

    def held_out(self, step: int) -> dict[str, float]:
        """The eval and validation metrics due for the current policy after `step` updates."""
        metrics = {}
        if evaluates(self.spec, step):
            metrics.update(self.evaluate(step))
        if validates(self.spec, step):
            metrics.update(self.validate(step))
        return metrics

    def prompt_ids(self, env: Environment, index: int, split: str, template_kwargs: dict | None = None) -> tuple[list[int], object]:
        """Return the prompt token ids and the example `index` of `split`; `template_kwargs` go
        to the chat template (default: the training sampling's, those the template uses)."""
        example = env.example(index, split)
        kwargs = self.template_kwargs if template_kwargs is None else template_kwargs
        ids = self.tokenizer.apply_chat_template(
            example.messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        return list(ids), example

    def sampling_params(self, sampling) -> dict:
        """The extra vLLM SamplingParams of a sampling section (none on the transformers backend)."""
        return sampling.sampling_params() if self.config.rollout_backend == "vllm" else {}

    def generate_batch(self, step: int, policy_version: int, backend=None) -> RolloutBatch:
        """Sample and score the rollouts of `step` (examples and seed derived from seed and step)."""
        spec = self.spec
        started = time.perf_counter()
        env_indices, prompts, examples = [], [], []
        for index, env_index in self.schedule.step_groups(step):
            ids, example = self.prompt_ids(self.environments[env_index], index, "train")
            env_indices.append(env_index)
            prompts.append(ids)
            examples.append(example)
        group_sizes = [self.group_sizes[env_index] for env_index in env_indices]
        rows = self.sample_groups(
            [self.environments[env_index] for env_index in env_indices], prompts, examples, backend or self.backend, n=group_sizes,
            max_tokens=spec.sampling.max_tokens, temperature=spec.sampling.temperature_at(step, spec.max_steps),
            seed=(spec.seed << 20) + step, sampling_params=self.sampling_params(spec.sampling),
            template_kwargs=self.template_kwargs,
        )
        completions = [row[0] for row in rows]
        versions = {completion.policy_version for completion in completions}
        if versions != {policy_version}:
            raise RuntimeError(f"step {step}: rollouts from policy versions {sorted(versions)}, expected {policy_version}")
        texts, rewards, functions = [row[1] for row in rows], [row[2] for row in rows], [row[3] for row in rows]
        return RolloutBatch(
            step=step, policy_version=policy_version, env_indices=env_indices, prompts=prompts,
            completions=completions, texts=texts, rewards=rewards, functions=functions,
            generate_seconds=time.perf_counter() - started, env_names=self.env_names, group_sizes=group_sizes,
        )


    def sample_groups(
        self, environments: list[Environment], prompts: list[list[int]], examples: list, backend, *, n: int | list[int],
        max_tokens: int, temperature: float, seed: int, sampling_params: dict, template_kwargs: dict,
    ) -> list[tuple[Completion, str, float, dict[str, float]]]:
        """Sample and score `n` rollouts of each group (environment `environments[g]`, prompt
        `prompts[g]`, example `examples[g]`; `n` one number for all, or `n[g]` per group); return
        (completion, text, reward, functions) per rollout, group by group. Single-turn groups of
        one size are sampled in one backend call (groups of another size in a call of their own,
        in the order their sizes first appear, its seed past the prompts of the calls before it, as
        backends seed prompt i of a call with `seed + i`) and scored by their environment; a
        multi-turn environment's groups run as episodes (engine/multi_turn.py), and `prompts[g]`
        becomes the group's shared first prompt."""
        groups = range(len(prompts))
        sizes = [n] * len(prompts) if isinstance(n, int) else list(n)
        rows: dict[int, list] = {}
        single = [g for g in groups if not environments[g].multi_turn]
        offset = 0
        for size in dict.fromkeys(sizes[g] for g in single):
            chosen = [g for g in single if sizes[g] == size]
            completions = backend.generate(
                [prompts[g] for g in chosen], n=size, max_tokens=max_tokens, temperature=temperature, seed=seed + offset,
                **extra_sampling(sampling_params),
            )
            offset += len(chosen)
            for position, g in enumerate(chosen):
                rows[g] = []
                for completion in completions[position * size:(position + 1) * size]:
                    text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
                    scores = environments[g].score_rollout(text, examples[g])
                    if scores.timed_out:  # its scoring ran past the [[env]] timeout
                        completion = dataclasses.replace(completion, timed_out=True)
                    rows[g].append((completion, text, scores.reward, scores.functions))
        multi_turn = []
        for g in groups:
            if g not in rows and all(environments[g] is not env for env in multi_turn):
                multi_turn.append(environments[g])
        for env in multi_turn:
            chosen = [g for g in groups if environments[g] is env]
            n = sizes[chosen[0]]  # an environment's groups are all of its block's size
            if any(sizes[g] != n for g in chosen):
                raise ValueError("the groups of one multi-turn environment must be of one size")
            episodes = run_episodes(
                env, [examples[g] for g in chosen], n, tokenizer=self.tokenizer, backend=backend,
                stop_token_ids=self.stop_token_ids, context_length=self.context_length, max_tokens=max_tokens,
                temperature=temperature, seed=seed, template_kwargs=template_kwargs, sampling=extra_sampling(sampling_params),
            )
            functions = complete_functions([episode.functions for episode in episodes], [f.name for f in env.rubric])
            for position, g in enumerate(chosen):
                group = episodes[position * n:(position + 1) * n]
                prompts[g], completions = group_rollouts(group)
                rows[g] = [
                    (completion, episode.text, episode.reward, functions[position * n + k])
                    for k, (completion, episode) in enumerate(zip(completions, group))
                ]
        return [row for g in groups for row in rows[g]]

    def _eval_targets(self) -> list[HeldOutTarget]:
        """The environments each eval samples: the `[[eval.env]]` blocks (loaded here, with
        their own example counts and group sizes), else the training environments.

        `num_examples = -1` takes the environment's whole eval split (`Environment.eval_size`);
        a block without a count or group size takes `[eval]`'s (default 1 rollout per example).
        A target's metric name is its block's `name`, else its environment's (`block_names`).
        """
        spec = self.spec
        default_rollouts = spec.eval.rollouts_per_example or 1
        if spec.eval.env:
            blocks, names = [], []
            for block in spec.eval.env:
                env = apply_block(load_environment(block.id, block.environment_args(self._environment_arguments(block.id)), spec.seed), block)
                blocks.append((env, block.num_examples, block.rollouts_per_example or block.group_size))
                names.append(block.name or env.name)
            names = block_names(names)
        else:
            blocks, names = [(env, None, None) for env in self.environments], self.env_names
        targets = []
        for (env, count, rollouts), name in zip(blocks, names):
            count = count if count is not None else spec.eval.num_examples
            targets.append(HeldOutTarget(
                env, name, "eval", env.eval_size if count == -1 else count, rollouts or default_rollouts,
            ))
        return targets

    @staticmethod
    def _environment_arguments(env_id: str) -> set[str]:
        """The argument names environment `env_id` takes (none when it is not installed:
        load_environment then says so)."""
        info = list_environments().get(env_id)
        return set(info.args) if info else set()

    def _held_out(self, prefix: str, targets: list[HeldOutTarget], *, max_tokens: int, temperature: float,
                  seed: int, sampling_params: dict, template_kwargs: dict) -> dict[str, float]:
        """Sample and score every target with the current weights of the rollout backend;
        return `<prefix>/<name>/mean` (mean reward over all its rollouts, a timed-out one
        counting 0), `<prefix>/<name>/<function>/mean` per reward function, and for a target
        with an `[[env]] timeout` (or a rollout that timed out) `<prefix>/<name>/is_timeout/mean`,
        the share of its rollouts past the timeout."""
        results = {}
        for target in targets:
            env, rewards, functions = target.environment, [], {f.name: [] for f in target.environment.rubric}
            timed_out = []
            for first in range(0, target.num_examples, _HELD_OUT_PROMPTS_PER_CALL):
                indices = range(first, min(target.num_examples, first + _HELD_OUT_PROMPTS_PER_CALL))
                prompts, examples = [], []
                for index in indices:
                    ids, example = self.prompt_ids(env, index, target.split, template_kwargs)
                    prompts.append(ids)
                    examples.append(example)
                rows = self.sample_groups(
                    [env] * len(prompts), prompts, examples, self.backend, n=target.rollouts_per_example, max_tokens=max_tokens, temperature=temperature,
                    seed=seed + first, sampling_params=sampling_params, template_kwargs=template_kwargs,
                )
                for completion, _, reward, scores in rows:
                    rewards.append(reward)
                    timed_out.append(completion.timed_out)
                    for name, value in scores.items():
                        functions.setdefault(name, []).append(value)
            results[f"{prefix}/{target.name}/mean"] = sum(rewards) / len(rewards)
            if getattr(env, "timeout", None) is not None or any(timed_out):
                results[f"{prefix}/{target.name}/is_timeout/mean"] = sum(timed_out) / len(timed_out)
            for name, values in functions.items():
                if not values:
                    continue
                results[f"{prefix}/{target.name}/{name}/mean"] = sum(values) / len(values)
        return results

    def evaluate(self, step: int) -> dict[str, float]:
        """Eval metrics of the current policy (`eval/<env>/mean`, `eval/<env>/<function>/mean`)
        on the eval split of each eval target, sampled with `[eval.sampling]` over `[sampling]`
        (temperature: the eval's, else the spec's base `sampling.temperature`). The same seed at
        every eval, so evals of successive policies see the same examples and draws."""
        spec = self.spec
        overrides = spec.eval.sampling
        max_tokens = (overrides.max_tokens if overrides else None) or spec.sampling.max_tokens
        temperature = overrides.temperature if overrides and overrides.temperature is not None else spec.sampling.temperature
        params = {**self.sampling_params(spec.sampling), **(self.sampling_params(overrides) if overrides else {})}
        return self._held_out(
            "eval", self.eval_targets, max_tokens=max_tokens, temperature=temperature,
            seed=(spec.seed << 20) + _EVAL_SEED_OFFSET, sampling_params=params, template_kwargs=self.eval_template_kwargs,
        )

    def validate(self, step: int) -> dict[str, float]:
        """Validation metrics (`val/<env>/mean`, `val/<env>/<function>/mean`) of the current
        policy on the val split of each training environment, sampled as training samples at
        `step` (its max_tokens, temperature and options)."""
        spec = self.spec
        return self._held_out(
            "val", self.val_targets, max_tokens=spec.sampling.max_tokens,
            temperature=spec.sampling.temperature_at(step, spec.max_steps), seed=(spec.seed << 20) + _VAL_SEED_OFFSET,
            sampling_params=self.sampling_params(spec.sampling), template_kwargs=self.template_kwargs,
        )

    def teacher_batch(self, step: int, policy_version: int, backend=None) -> RolloutBatch:
        """Ask the teacher for the completions of `step`'s prompts (the examples a GRPO step
        would take) and score them; `backend` is unused (the teacher samples)."""
        from engine.distill import teacher_token_ids

        spec = self.spec
        sampling = spec.teacher.sampling
        started = time.perf_counter()
        requests = []
        for index, env_index in self.schedule.step_groups(step):
            ids, example = self.prompt_ids(self.environments[env_index], index, "train")
            requests.append((index, env_index, ids, example))
        max_tokens = (sampling.max_tokens if sampling and sampling.max_tokens else None) or spec.sampling.max_tokens
        temperature = sampling.temperature if sampling and sampling.temperature is not None else spec.sampling.temperature_at(step, spec.max_steps)
        extra = dict(sampling.extra_body or {}) if sampling else {}
        if sampling and sampling.enable_thinking is not None:
            extra["chat_template_kwargs"] = {**extra.get("chat_template_kwargs", {}), "enable_thinking": sampling.enable_thinking}
        if sampling and sampling.reasoning_effort is not None:
            extra["reasoning_effort"] = sampling.reasoning_effort

        def ask(request):
            index, env_index, _, example = request
            return self.teacher.complete(
                example.messages, n=self.group_sizes[env_index], max_tokens=max_tokens, temperature=temperature,
                seed=(spec.seed << 20) + index, extra_body=extra,
            )

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(requests)), thread_name_prefix="teacher") as pool:
            answers = list(pool.map(ask, requests))
        completions, texts, rewards, functions = [], [], [], []
        for (_, env_index, ids, example), answer in zip(requests, answers):
            room = max(0, min(max_tokens, self.context_length - len(ids)))
            for teacher_completion in answer:
                token_ids = teacher_token_ids(self.tokenizer, teacher_completion, end_token_id=self.end_token_id, max_tokens=room)
                completions.append(Completion(token_ids=token_ids, logprobs=[], truncated=not teacher_completion.finished,
                                              policy_version=policy_version))
                scores = self.environments[env_index].score_rollout(teacher_completion.text, example)
                texts.append(teacher_completion.text)
                rewards.append(scores.reward)
                functions.append(scores.functions)
        return RolloutBatch(
            step=step, policy_version=policy_version, env_indices=[r[1] for r in requests], prompts=[r[2] for r in requests],
            completions=completions, texts=texts, rewards=rewards, functions=functions,
            generate_seconds=time.perf_counter() - started, env_names=self.env_names,
            group_sizes=[self.group_sizes[r[1]] for r in requests],
        )
