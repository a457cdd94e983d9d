"""Checking a valid spec against what a Lab has installed: the model and environment
catalogues, passed in by the caller (the server's, or the engine's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from labsdk.spec.model import JobSpec
from labsdk.spec.problems import SpecProblem
from labsdk.spec.values import _json_type


class ModelInfoLike(Protocol):
    """What :func:`catalog_problems` needs of a model catalogue entry."""

    context_length: int


class EnvironmentInfoLike(Protocol):
    """What :func:`catalog_problems` needs of an environment catalogue entry."""

    args: Mapping[str, Any]


def _type_fits(value: Any, default: Any) -> bool:
    expected, given = _json_type(default), _json_type(value)
    return expected == "null" or given == expected or (expected, given) == ("number", "integer")


def catalog_problems(
    spec: JobSpec,
    *,
    models: Mapping[str, ModelInfoLike],
    environments: Mapping[str, EnvironmentInfoLike],
) -> list[SpecProblem]:
    """Check a valid spec against the installed model and environment catalogues.

    ``models`` maps catalogue ids to objects with ``context_length`` (tokens);
    ``environments`` maps environment ids to objects whose ``args`` holds each argument's
    default (its JSON type is the argument's type; a ``None`` default takes anything).
    Returns the problems (empty when the spec fits): ``unknown_model`` at ``model``,
    ``unknown_environment`` at ``env.N.id`` (and ``eval.env.N.id``), ``unknown_key``/``invalid_type``
    at ``env.N.args.KEY`` (and ``eval.env.N.args.KEY``; an eval environment's ``split`` it does
    not take is left out, :meth:`EvalEnvConfig.environment_args`), ``out_of_range`` at
    ``sampling.max_tokens`` beyond the context.
    """
    problems: list[SpecProblem] = []
    model = models.get(spec.model)
    if model is None:
        problems.append(SpecProblem(
            "model", "unknown_model",
            f"model '{spec.model}' is not in the catalogue; installed models: "
            f"{', '.join(sorted(models)) or 'none'}",
        ))
    elif spec.sampling.max_tokens > model.context_length:
        problems.append(SpecProblem(
            "sampling.max_tokens", "out_of_range",
            f"max_tokens {spec.sampling.max_tokens} exceeds the context length of "
            f"'{spec.model}' ({model.context_length} tokens)",
        ))
    blocks = [(f"env.{index}", env, env.args) for index, env in enumerate(spec.env)]
    # The server's checks of a spec that failed validation pass an object without [eval] (jobs/specs.py).
    eval_envs = getattr(getattr(spec, "eval", None), "env", None) or []
    for index, env in enumerate(eval_envs):
        environment = environments.get(env.id)
        blocks.append((f"eval.env.{index}", env, env.environment_args(environment.args if environment else {})))
    for where, env, args in blocks:
        environment = environments.get(env.id)
        if environment is None:
            problems.append(SpecProblem(
                f"{where}.id", "unknown_environment",
                f"environment '{env.id}' is not installed; installed environments: "
                f"{', '.join(sorted(environments)) or 'none'}",
            ))
            continue
        defaults = environment.args
        for key, value in args.items():
            if key not in defaults:
                problems.append(SpecProblem(
                    f"{where}.args.{key}", "unknown_key",
                    f"'{env.id}' takes no argument '{key}'; allowed: "
                    f"{', '.join(defaults) or 'none'}",
                ))
            elif not _type_fits(value, defaults[key]):
                problems.append(SpecProblem(
                    f"{where}.args.{key}", "invalid_type",
                    f"'{key}' must be a JSON {_json_type(defaults[key])}, "
                    f"not {_json_type(value)}",
                ))
    return problems
