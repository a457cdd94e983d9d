"""The warnings of a valid spec: one sentence per key that Lab accepts and stores but does
not act on (yet), naming the key by its dotted path and saying what Lab does instead.

Warnings look at the keys that were given (decoded data in Lab's layout), not at defaults,
so a spec that uses none of these keys has none. docs/spec.md lists every key with what it
does; this module is where "Lab does not use it" is said, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labsdk.spec.model import JobSpec

_STORED = "it is stored and ignored"


def _not_yet(path: str, why: str = "") -> str:
    return f"'{path}': Lab does not use it yet" + (f" ({why})" if why else "") + f"; {_STORED}"


#: Keys Lab stores but never acts on, with why (dotted path -> reason).
_NOT_USED: dict[str, str] = {
    "cluster_name": "Lab places jobs on its own pool",
    "run_config": "Lab has no run-level settings beyond the spec",
    "wandb": "Lab does not export to Weights & Biases yet; metrics are on the job page and at /metrics",
    "infrastructure": "Lab sizes a job from its [resources] table",
    "tailscale": "Lab's environments run inside the job; no auth_key is stored",
    "env_file": "the deprecated spelling of env_files: files on your machine, which the lab CLI reads; "
                "the server never reads files, send their pairs as the request's secrets",
    "env_files": "files on your machine, which the lab CLI reads and sends as the job's secrets; "
                 "the server never reads files, send their pairs as the request's secrets",
}

#: Deprecated keys Prime itself strips, with their replacement.
_DEPRECATED: dict[str, str] = {
    "trajectory_strategy": "Prime removed it; there is no replacement",
    "buffer": 'Prime removed the difficulty buffer; use [[pre_batch_filters]] with type = "zero_advantage"',
}

#: Keys Lab validates and stores but whose behaviour is still to come (dotted path -> what Lab does now).
_NOT_YET_USED: dict[str, str] = {
    "max_inflight_rollouts": "the engine samples one batch of batch_size rollouts at a time",
    "oversampling_factor": "the engine samples one batch of batch_size rollouts at a time",
    "sampling.extra_body": "it is not passed to the inference backend",
    "sampling.enable_thinking": "the chat template is applied with its defaults",
    "sampling.reasoning_effort": "the chat template is applied with its defaults",
    "eval.rollouts_per_example": "each eval example is sampled once",
    "eval.sampling": "eval rollouts use the training sampling settings",
    "eval.env": "evals run on the training environments",
    "val": "there is no validation besides [eval]",
    "pre_batch_filters": "every rollout is trained on",
    "post_batch_filters": "every rollout is trained on",
}

#: Fields of an ``[[env]]`` block still to come.
_ENV_NOT_YET_USED = (
    "name", "max_retries", "harness", "ratio", "group_size", "max_turns", "max_input_tokens",
    "max_output_tokens", "timeout", "retries",
)


def _lookup(data: Any, path: str) -> tuple[bool, Any]:
    node = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return node is not None, node


def spec_warnings(data: Mapping[str, Any], spec: JobSpec) -> list[str]:
    """Return the warnings of ``spec``, validated from ``data`` (decoded, in Lab's layout),
    in the spec's key order."""
    warnings: list[str] = []

    def given(path: str) -> bool:
        return _lookup(data, path)[0]

    for path in ("max_inflight_rollouts", "oversampling_factor"):
        if given(path):
            warnings.append(_not_yet(path, _NOT_YET_USED[path]))
    if given("max_async_level"):
        if given("max_off_policy_steps"):
            warnings.append(
                "'max_async_level' is deprecated (prime-rl renamed it max_off_policy_steps) and ignored "
                "because max_off_policy_steps is set"
            )
        else:
            warnings.append(
                "'max_async_level' is deprecated: prime-rl renamed it max_off_policy_steps; Lab uses it as "
                f"max_off_policy_steps = {spec.max_off_policy_steps}"
            )
    for path in ("sampling.extra_body", "sampling.enable_thinking", "sampling.reasoning_effort"):
        if given(path):
            warnings.append(_not_yet(path, _NOT_YET_USED[path]))
    envs = data.get("env") if isinstance(data.get("env"), list) else []
    for index, env in enumerate(envs):
        for key in _ENV_NOT_YET_USED:
            if isinstance(env, Mapping) and env.get(key) is not None:
                warnings.append(_not_yet(f"env.{index}.{key}"))
    if _lookup(data, "eval.num_examples")[1] == -1:
        warnings.append(
            "'eval.num_examples' = -1 (the whole eval split): Lab does not size evals by the split yet; "
            f"each eval takes {spec.eval.num_examples} examples per environment, and the spec stores that"
        )
    if given("eval.eval_base_model"):
        warnings.append(
            "'eval.eval_base_model' is deprecated: prime-rl renamed it skip_first_step with the inverse "
            + ("meaning; it is ignored because eval.skip_first_step is set" if given("eval.skip_first_step")
               else f"meaning; Lab reads it as skip_first_step = {str(spec.eval.skip_first_step).lower()}")
        )
    if spec.eval.skip_first_step is False:
        warnings.append(
            "'eval.skip_first_step' = false: Lab does not evaluate the base model before step 1 yet; "
            "the first eval is at step eval.interval"
        )
    for path in ("eval.rollouts_per_example", "eval.sampling", "eval.env", "val", "pre_batch_filters",
                 "post_batch_filters"):
        if given(path):
            warnings.append(_not_yet(path, _NOT_YET_USED[path]))
    for path, reason in _NOT_USED.items():
        if given(path):
            warnings.append(f"'{path}' is a Prime Intellect setting that Lab does not use ({reason}); {_STORED}")
    for path, replacement in _DEPRECATED.items():
        if given(path):
            warnings.append(f"'{path}' is deprecated and ignored ({replacement}); {_STORED}")
    return warnings
