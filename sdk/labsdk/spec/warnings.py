"""The warnings of a valid spec: one sentence per key that Lab accepts and stores but does
not act on (yet), naming the key by its dotted path and saying what Lab does instead.

Warnings look at the keys that were given (decoded data in Lab's layout), not at defaults,
so a spec that uses none of these keys has none. docs/spec.md lists every key with what it
does; this module is where "Lab does not use it" is said, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labsdk.spec.model import CHAT_TEMPLATE_KWARGS_KEY, EVAL_SPLIT_ARG, FILTER_SETTINGS, VLLM_SAMPLING_KEYS, JobSpec

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
}

#: Fields of an ``[[env]]`` block still to come (``max_turns``, ``max_input_tokens`` and
#: ``max_output_tokens`` bound multi-turn episodes: engine/multi_turn.py; ``group_size`` is
#: each block's rollouts per example: engine/groups.py).
_ENV_NOT_YET_USED = ("harness",)


#: The ``[[env]]`` keys that bound a multi-turn episode (engine/multi_turn.py), with what they bound.
_EPISODE_LIMITS = {
    "max_turns": "the turns of",
    "max_input_tokens": "the tokens fed in to each turn of",
    "max_output_tokens": "the tokens each agent samples in",
}


def _built_in_id(env: Mapping[str, Any]) -> str | None:
    """Return the id of an ``[[env]]`` block (its ``taskset.id`` in the v1 form) when it names one
    of Lab's built-in environments (``lab/...``), else None."""
    env_id = env.get("id")
    if env_id is None and isinstance(env.get("taskset"), Mapping):
        env_id = env["taskset"].get("id")
    return env_id if isinstance(env_id, str) and env_id.startswith("lab/") else None


def _timeout_warning(path: str, env: Mapping[str, Any]) -> list[str]:
    """Warn that an ``[[env]]`` ``timeout`` does nothing on one of Lab's built-in environments:
    the timeout bounds a verifiers environment's own code (a multi-turn episode, a taskset's
    scoring), and a built-in one scores in the engine, at once."""
    env_id = _built_in_id(env)
    if env.get("timeout") is None or env_id is None:
        return []
    return [
        f"'{path}': {env_id} is one of Lab's built-in environments, which score in the engine; the timeout "
        f"bounds a verifiers environment's episode or scoring and does not apply to it; {_STORED}"
    ]


def single_turn_warnings(path: str, env_id: str, env: Mapping[str, Any]) -> list[str]:
    """Warn that the episode limits set in the ``[[env]]`` block ``env`` at ``path`` (``env.0``)
    do nothing on ``env_id``, a single-turn environment (one completion per example): they
    bound a multi-turn episode between its turns. Lab says so of an uploaded package whose
    build recorded it single-turn (jobs.specs); :func:`spec_warnings` of the built-ins."""
    return [
        f"'{path}.{key}': {env_id} is a single-turn environment (one completion per example), so {key}, which "
        f"bounds {what} a multi-turn episode, has no effect on it; {_STORED}"
        for key, what in _EPISODE_LIMITS.items() if env.get(key) is not None
    ]


def _episode_limit_warnings(path: str, env: Mapping[str, Any]) -> list[str]:
    """Warn about the episode limits of an ``[[env]]`` block at ``path`` naming one of Lab's
    built-in environments, which are all single-turn."""
    env_id = _built_in_id(env)
    return [] if env_id is None else single_turn_warnings(path, env_id, env)


def _extra_body_warnings(section: str, sampling: Any) -> list[str]:
    """Warn about the keys of ``<section>.extra_body`` that Lab passes nowhere, and say that the
    vLLM sampling parameters among them apply only when the engine samples with vLLM."""
    warnings = []
    for key in sampling.unknown_extra_body_keys():
        warnings.append(
            f"'{section}.extra_body.{key}' is not a sampling parameter Lab passes on (it passes "
            f"{', '.join(sorted(VLLM_SAMPLING_KEYS))} to vLLM's sampler and {CHAT_TEMPLATE_KWARGS_KEY} to the "
            f"chat template); {_STORED}"
        )
    passed = sorted(sampling.sampling_params())
    if passed:
        warnings.append(
            f"'{section}.extra_body' ({', '.join(passed)}): applied when the engine samples with vLLM "
            "(LAB_ENGINE_ROLLOUT=vllm); the transformers backend samples without them"
        )
    return warnings


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

    inflight = spec.max_inflight_rollouts
    if inflight is None and spec.oversampling_factor is not None:
        inflight = spec.oversampling_factor * spec.batch_size
    if inflight is not None and inflight % spec.batch_size:
        batches = max(1, int(inflight // spec.batch_size))
        path = "max_inflight_rollouts" if spec.max_inflight_rollouts is not None else "oversampling_factor"
        warnings.append(
            f"'{path}': the engine samples whole batches ahead, so it keeps {batches} batch"
            f"{'es' if batches > 1 else ''} of {spec.batch_size} rollouts in flight ({batches * spec.batch_size} rollouts), "
            f"and never more than max_off_policy_steps = {spec.max_off_policy_steps}"
        )
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
    warnings.extend(_extra_body_warnings("sampling", spec.sampling))
    envs = data.get("env") if isinstance(data.get("env"), list) else []
    for index, env in enumerate(envs):
        for key in _ENV_NOT_YET_USED:
            if isinstance(env, Mapping) and env.get(key) is not None:
                warnings.append(_not_yet(f"env.{index}.{key}"))
        if isinstance(env, Mapping):
            warnings.extend(_episode_limit_warnings(f"env.{index}", env))
            warnings.extend(_timeout_warning(f"env.{index}.timeout", env))
    if given("eval.eval_base_model"):
        warnings.append(
            "'eval.eval_base_model' is deprecated: prime-rl renamed it skip_first_step with the inverse "
            + ("meaning; it is ignored because eval.skip_first_step is set" if given("eval.skip_first_step")
               else f"meaning; Lab reads it as skip_first_step = {str(spec.eval.skip_first_step).lower()}")
        )
    if spec.eval.sampling is not None:
        warnings.extend(_extra_body_warnings("eval.sampling", spec.eval.sampling))
    eval_envs = _lookup(data, "eval.env")[1] if isinstance(_lookup(data, "eval.env")[1], list) else []
    for index, env in enumerate(eval_envs):
        if isinstance(env, Mapping) and isinstance(env.get("args"), Mapping) and EVAL_SPLIT_ARG in env["args"]:
            warnings.append(
                f"'eval.env.{index}.args.{EVAL_SPLIT_ARG}': Lab evaluates each environment on its own eval split "
                "(held out from training); an environment that takes no such argument is loaded without it"
            )
        for key in _ENV_NOT_YET_USED:
            if isinstance(env, Mapping) and env.get(key) is not None:
                warnings.append(_not_yet(f"eval.env.{index}.{key}"))
        if isinstance(env, Mapping):
            warnings.extend(_episode_limit_warnings(f"eval.env.{index}", env))
            warnings.extend(_timeout_warning(f"eval.env.{index}.timeout", env))
    for slot in ("pre_batch_filters", "post_batch_filters"):
        for index, batch_filter in enumerate(getattr(spec, slot) or []):
            for key in batch_filter.unknown_settings():
                settings = ", ".join(FILTER_SETTINGS[batch_filter.type]) or "none"
                warnings.append(
                    f"'{slot}.{index}.{key}' is not a setting of Lab's {batch_filter.type} filter "
                    f"(its settings: {settings}); {_STORED}"
                )
    for path, reason in _NOT_USED.items():
        if given(path):
            warnings.append(f"'{path}' is a Prime Intellect setting that Lab does not use ({reason}); {_STORED}")
    for path, replacement in _DEPRECATED.items():
        if given(path):
            warnings.append(f"'{path}' is deprecated and ignored ({replacement}); {_STORED}")
    return warnings
