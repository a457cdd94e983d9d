"""An evaluation run (`python -m engine evaluate`): sample and score every example of every
environment an evaluation names with a model that never trains, and report every sample to Lab.

The job's spec is a job spec (docs/spec.md) whose `[eval]` section is the evaluation: its
`[[eval.env]]` blocks (an environment with its `args`, `num_examples`, -1 being the
environment's whole eval split, and `rollouts_per_example`), `[eval.sampling]` (`max_tokens`,
`temperature`, `extra_body.top_p`) and the spec's `seed`. The model is the spec's `model`, with
the weights of the checkpoint the run starts from when it names one (`init_from`, or the adapter
`[eval] adapter` names: a LoRA adapter is merged into the base weights, full weights replace them). Nothing of the training
settings applies: no optimizer is built and no step is taken.

Order and seeds, so that a rerun (a restarted attempt) samples the same prompts in the same order
and, on CPU, the same completions: environment by environment, examples 0, 1, ... of its eval
split (its seed is the spec's), `PROMPTS_PER_CALL` prompts per backend call, each with
`rollouts_per_example` rollouts, the call's seed `call_seed(seed, environment, first example)`.
Each rollout goes to Lab as one sample (`Reporter.evaluation_samples`), keyed by (environment,
example, rollout): Lab stores it once however often it arrives.

Generation and scoring are the in-job eval's (engine.orchestrator.Orchestrator.sample_groups):
single-turn prompts are sampled in one batched call per chunk, multi-turn environments run as
episodes. A chunk whose environment code fails past its `[[env]] retries` is sampled again one
example at a time, so that only the examples whose scoring fails are reported as errors (reward
0, no function scored, the failure's text); a rollout whose scoring ran past its `timeout` is
reported timed out (reward 0).

An evaluation of an endpoint (`[eval.endpoint]`: an OpenAI-compatible endpoint, or a Lab
deployment's) loads no model: each rollout is one chat completion of the example's messages at
that endpoint (engine/endpoint_sampling.py), seeded `call_seed(seed, environment, example) +
rollout`, `PROMPTS_PER_CALL` examples per chunk with `ENDPOINT_CONCURRENCY` requests in flight;
its tokens are the endpoint's `usage`. Multi-turn environments are refused (exit 2).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import pathlib
import threading
import time
from dataclasses import dataclass, field

import torch

from engine import checkpoints as ckpt
from engine.checkpoint_archives import STATE_DIR
from engine.config import EngineConfig
from engine.endpoint_sampling import EndpointClient
from engine.environments import EnvironmentFailed, InvalidEnvironment
from engine.models import context_length, huggingface_dir, load_model, stop_token_ids
from engine.orchestrator import HeldOutTarget, Orchestrator
from engine.policy import is_lora, load_policy, make_trainable, policy_snapshot
from engine.reporter import Reporter
from engine.rollout import TransformersBackend
from engine.vllm_backend import VLLMBackend

logger = logging.getLogger("engine")

#: Prompts per backend call (each with its rollouts): bounds the memory of one batched call.
PROMPTS_PER_CALL = 64
#: Requests an endpoint evaluation keeps in flight at once.
ENDPOINT_CONCURRENCY = 8


def call_seed(seed: int, environment: int, first: int) -> int:
    """The sampling seed of the call whose first prompt is example `first` of environment
    number `environment`: `(seed << 24) + (environment << 16) + first` (examples number at most
    10,000 < 2^16, environments at most 16)."""
    return (seed << 24) + (environment << 16) + first


@dataclass
class Evaluator:
    """Runs one evaluation: `setup(init_dir)`, then `run()`."""

    config: EngineConfig
    workdir: pathlib.Path
    reporter: Reporter
    stop_event: threading.Event = field(default_factory=threading.Event)
    model_dir: pathlib.Path | None = None
    #: Samples reported so far by this attempt (the heartbeat's step).
    reported: int = 0
    #: The endpoint an endpoint evaluation samples through (`[eval.endpoint]`); None otherwise.
    endpoint: EndpointClient | None = None

    def setup(self, init_dir: pathlib.Path | None = None) -> None:
        """Load the model (with `init_dir`'s checkpoint weights when given), start the rollout
        backend and load the environments. Raises engine.models.ModelNotFound,
        environments.InvalidEnvironment, and ValueError for a checkpoint that does not fit the
        model (exit 2 upstream); for an endpoint evaluation, `setup_endpoint`'s errors."""
        config, spec = self.config, self.config.spec
        if spec.eval.endpoint is not None:
            self.setup_endpoint()
            return
        self.device = torch.device(config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        model, self.tokenizer = load_model(spec.model, self.model_dir, dtype=dtype)
        model.to(self.device)
        self.stop_token_ids = stop_token_ids(model, self.tokenizer)
        self.context_length = context_length(model)
        vllm_path = huggingface_dir(spec.model, model, self.model_dir, self.workdir) if config.rollout_backend == "vllm" else None
        if init_dir is not None:
            # The checkpoint's own layout: a LoRA adapter of the spec's rank, or full weights.
            model = make_trainable(model, lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, base_model_id=spec.model)
            if (init_dir / STATE_DIR).is_dir():
                state = ckpt.load_weights(init_dir, model=model, base_model_id=spec.model)
                logger.info("evaluating %s with the weights of %s (its step %d)", spec.model, init_dir.name, state.step)
            else:  # an adapter artifact (`[eval] adapter`): the weights alone
                ckpt.load_adapter_weights(init_dir, model=model, base_model_id=spec.model)
                logger.info("evaluating %s with the weights of adapter %s", spec.model, init_dir.name)
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        model.eval()
        if vllm_path is not None:
            backend = VLLMBackend(
                vllm_path, seed=spec.seed, max_model_len=self.context_length, stop_token_ids=self.stop_token_ids,
                workdir=self.workdir, dtype=config.vllm_dtype, max_lora_rank=0,
            )
            if init_dir is not None:
                load_policy(backend, policy_snapshot(model, backend), 0)
        else:
            sampler = model.merge_and_unload() if is_lora(model) else model
            backend = TransformersBackend(sampler, pad_token_id=self.tokenizer.pad_token_id, stop_token_ids=self.stop_token_ids)
        self.orchestrator = Orchestrator(config, self.tokenizer, self.stop_token_ids, self.context_length, backend=backend)
        self.orchestrator.setup_eval()

    def setup_endpoint(self) -> None:
        """Load the environments and the client of `[eval.endpoint]`, and no model. Raises
        environments.InvalidEnvironment (a multi-turn environment among them too) and
        endpoint_sampling.EndpointRefused (its secret missing)."""
        self.orchestrator = Orchestrator(self.config, None, [], 0)
        # The targets alone: the chat template arguments of setup_eval need a tokenizer, and the
        # endpoint applies its own template.
        self.orchestrator.eval_targets = self.orchestrator._eval_targets()
        multi_turn = [target.environment.id for target in self.orchestrator.eval_targets if target.environment.multi_turn]
        if multi_turn:
            raise InvalidEnvironment(
                f"environment {multi_turn[0]} is multi-turn; an endpoint evaluation samples single completions"
            )
        self.endpoint = EndpointClient.from_spec(self.config.spec.eval.endpoint)
        logger.info("evaluating %s at %s", self.endpoint.model, self.endpoint.base_url)

    def close(self) -> None:
        """Stop the rollout backend's processes (vLLM's engine) and the endpoint's connections;
        safe to call twice."""
        if self.endpoint is not None:
            self.endpoint.close()
        backend = getattr(getattr(self, "orchestrator", None), "backend", None)
        close = getattr(backend, "close", None)
        if close is not None:
            close()

    def _stop_requested(self) -> bool:
        return self.stop_event.is_set() or self.reporter.stop_requested.is_set()

    def sampling(self) -> tuple[int, float, dict]:
        """Return the evaluation's max tokens, temperature and backend sampling parameters:
        `[eval.sampling]` over `[sampling]`; the vLLM backend takes every `extra_body` key it
        knows, the transformers backend `top_p` alone."""
        spec = self.config.spec
        overrides = spec.eval.sampling
        max_tokens = (overrides.max_tokens if overrides else None) or spec.sampling.max_tokens
        temperature = overrides.temperature if overrides and overrides.temperature is not None else spec.sampling.temperature
        params = overrides.sampling_params() if overrides else {}
        if self.config.rollout_backend != "vllm":
            params = {key: value for key, value in params.items() if key == "top_p"}
        return max_tokens, temperature, params

    def run(self) -> str:
        """Sample, score and report every (environment, example, rollout); return "succeeded",
        or "stopped" between two calls when a stop was requested (SIGTERM or Lab's `action: stop`)."""
        sampler = f"endpoint {self.endpoint.base_url}" if self.endpoint is not None else f"rollout backend: {self.config.rollout_backend}"
        self.reporter.set_status("running", 0, f"evaluating; {sampler}")
        for index, target in enumerate(self.orchestrator.eval_targets):
            started = time.perf_counter()
            for first in range(0, target.num_examples, PROMPTS_PER_CALL):
                if self._stop_requested():
                    logger.info("stop requested: stopped after %d samples", self.reported)
                    return "stopped"
                examples = range(first, min(target.num_examples, first + PROMPTS_PER_CALL))
                samples = self._sample(index, target, list(examples))
                self.reporter.evaluation_samples(samples)
                self.reported += len(samples)
                self.reporter.set_status("running", self.reported)
            logger.info(
                "environment %s: %d examples x %d rollouts scored in %.1fs",
                target.environment.id, target.num_examples, target.rollouts_per_example, time.perf_counter() - started,
            )
        return "succeeded"

    def _sample(self, index: int, target: HeldOutTarget, examples: list[int]) -> list[dict]:
        """Sample and score examples `examples` of target number `index`; return their samples
        (every rollout of each), sampling again one example at a time when the environment's
        code fails, and reporting an example that still fails as errors."""
        try:
            return self._sample_call(index, target, examples)
        except EnvironmentFailed as error:
            if len(examples) == 1:
                logger.warning("environment %s, example %d: %s", target.environment.id, examples[0], error)
                return self._failed(index, target, examples[0], str(error))
        samples = []
        for example in examples:
            try:
                samples += self._sample_call(index, target, [example])
            except EnvironmentFailed as error:
                logger.warning("environment %s, example %d: %s", target.environment.id, example, error)
                samples += self._failed(index, target, example, str(error))
        return samples

    def _sample_call(self, index: int, target: HeldOutTarget, examples: list[int]) -> list[dict]:
        """One batched call: the prompts of `examples`, `rollouts_per_example` rollouts each."""
        if self.endpoint is not None:
            return self._endpoint_call(index, target, examples)
        orchestrator, env = self.orchestrator, target.environment
        max_tokens, temperature, params = self.sampling()
        prompts, chosen = [], []
        for example in examples:
            ids, drawn = orchestrator.prompt_ids(env, example, "eval", orchestrator.eval_template_kwargs)
            prompts.append(ids)
            chosen.append(drawn)
        prompt_tokens = [len(ids) for ids in prompts]  # sample_groups turns a multi-turn prompt into its first one
        started = time.perf_counter()
        rows = orchestrator.sample_groups(
            [env] * len(prompts), prompts, chosen, orchestrator.backend, n=target.rollouts_per_example,
            max_tokens=max_tokens, temperature=temperature, seed=call_seed(self.config.spec.seed, index, examples[0]),
            sampling_params=params, template_kwargs=orchestrator.eval_template_kwargs,
        )
        latency = time.perf_counter() - started
        samples = []
        for position, (completion, text, reward, functions) in enumerate(rows):
            group, rollout = divmod(position, target.rollouts_per_example)
            samples.append(self._record(index, target, examples[group], rollout, chosen[group]) | {
                "completion": text,
                "reward": float(reward),
                "functions": {name: float(value) for name, value in functions.items()},
                "prompt_tokens": prompt_tokens[group],
                "completion_tokens": completion.sampled_count,
                "latency_s": round(latency, 6),
                "truncated": bool(completion.truncated),
                "timed_out": bool(completion.timed_out),
            })
        return samples

    def _endpoint_call(self, index: int, target: HeldOutTarget, examples: list[int]) -> list[dict]:
        """The rollouts of `examples` through the endpoint, one request each, scored by the
        environment; raises EnvironmentFailed when its scoring fails."""
        env = target.environment
        max_tokens, temperature, _ = self.sampling()
        overrides = self.config.spec.eval.sampling
        extra = dict(overrides.extra_body or {}) if overrides else {}  # top_p, as OpenAI's body takes it
        drawn = {example: env.example(example, "eval") for example in examples}
        keys = [(example, rollout) for example in examples for rollout in range(target.rollouts_per_example)]

        def ask(key: tuple[int, int]):
            example, rollout = key
            return self.endpoint.complete(
                drawn[example].messages, max_tokens=max_tokens, temperature=temperature,
                seed=call_seed(self.config.spec.seed, index, example) + rollout, extra_body=extra,
            )

        with concurrent.futures.ThreadPoolExecutor(max_workers=ENDPOINT_CONCURRENCY, thread_name_prefix="endpoint") as pool:
            answers = list(pool.map(ask, keys))
        samples = []
        for (example, rollout), answer in zip(keys, answers):
            scores = env.score_rollout(answer.text, drawn[example])
            samples.append(self._record(index, target, example, rollout, drawn[example]) | {
                "completion": answer.text,
                "reward": float(scores.reward),
                "functions": {name: float(value) for name, value in scores.functions.items()},
                "prompt_tokens": answer.prompt_tokens,
                "completion_tokens": answer.completion_tokens,
                "latency_s": round(answer.latency_s, 6),
                "truncated": answer.truncated,
                "timed_out": bool(scores.timed_out),
            })
        return samples

    def _failed(self, index: int, target: HeldOutTarget, example: int, error: str) -> list[dict]:
        """The samples of an example whose environment code kept failing: reward 0, the error."""
        drawn = target.environment.example(example, "eval")
        return [
            self._record(index, target, example, rollout, drawn) | {"completion": "", "reward": 0.0, "error": error[:4000]}
            for rollout in range(target.rollouts_per_example)
        ]

    @staticmethod
    def _record(index: int, target: HeldOutTarget, example: int, rollout: int, drawn) -> dict:
        """What every sample says of its key and its example."""
        return {
            "environment": index,
            "example": example,
            "rollout": rollout,
            "num_examples": target.num_examples,
            "prompt": drawn.messages,
            "answer": str(drawn.answer),
            "info": json.loads(json.dumps(drawn.info or {}, default=str)),  # an environment's own values, as JSON
        }
