"""A job's ``[[env]] args`` for an uploaded package, checked against what its build recorded.

The server checks them at submit, ``lab spec check`` through the estimate, and ``lab envs try``
(the engine's ``engine.commands.try_environment``) before loading a package, with the same words.
A ready build's ``summary`` (``engine.environments.probe``) lists the arguments the package takes,
whatever its kind: a Lab environment's ``info.args``, ``load_environment``'s keyword parameters
(v0), a verifiers v1 taskset config's fields. Each has ``{"name", "default", "type", "required"}``,
``type`` the annotation as text (``"int"``, ``"list[str]"``, ``"int | None"``) or None.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from labsdk.spec.problems import SpecProblem

#: The recorded types checked at submit, by their name, with the JSON values each takes (a float
#: takes an integer too; a bool is never an integer). Other types are left to the package.
SIMPLE_TYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "int": ("an integer", (int,)),
    "float": ("a number", (int, float)),
    "str": ("a string", (str,)),
    "bool": ("true or false", (bool,)),
}
_OPTIONAL = re.compile(r"^(?:Optional\[(\w+)\]|(\w+) \| None|None \| (\w+))$")
#: How each kind's summary names what takes the arguments (``summary["api"]``).
_TAKER = {"v0": "its load_environment takes", "v1": "its taskset config takes", "lab": "it takes"}


def _simple_type(recorded: Any) -> tuple[str | None, bool]:
    """``(name, nullable)``: the simple type a recorded annotation names (``Optional[int]`` and
    ``int | None`` name ``int``, nullable), or ``(None, True)`` when it names no simple type."""
    if not isinstance(recorded, str):
        return None, True
    match = _OPTIONAL.match(recorded.strip())
    name, nullable = (next(group for group in match.groups() if group), True) if match else (recorded.strip(), False)
    return (name, nullable) if name in SIMPLE_TYPES else (None, True)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def type_problem(value: Any, parameter: Mapping[str, Any]) -> str | None:
    """Why ``value`` does not fit ``parameter``'s recorded simple type, or None when it fits (or
    the type is not a simple one). ``None`` fits a nullable type, and one whose default is None."""
    name, nullable = _simple_type(parameter.get("type"))
    if name is None:
        return None
    if value is None:
        return None if nullable or parameter.get("default") is None else f"must be {SIMPLE_TYPES[name][0]}, not null"
    described, accepted = SIMPLE_TYPES[name]
    if isinstance(value, accepted) and (name == "bool" or not isinstance(value, bool)):
        return None
    return f"must be {described} ({parameter.get('type')}), not {_json_type(value)}"


def argument_problems(where: str, env: Any, environment_id: str, summary: Mapping[str, Any]) -> list[SpecProblem]:
    """The problems of the block ``env`` (``env.N`` or ``eval.env.N`` at ``where``; anything with
    ``args``) naming the package ``environment_id`` whose latest ready build recorded ``summary``:
    ``unknown_key`` at ``<where>.args.KEY`` for an argument it does not take, naming those it takes,
    and ``invalid_type`` for a value that does not fit a simple recorded type (``SIMPLE_TYPES``).
    An ``[[eval.env]]`` block's ``split`` that the package does not take is Lab's own."""
    parameters = {parameter["name"]: parameter for parameter in summary.get("parameters") or []}
    args = getattr(env, "args", None) or {}
    if hasattr(env, "environment_args"):
        args = env.environment_args(parameters)
    taker = _TAKER.get(summary.get("api"), "it takes")
    problems = []
    for key, value in args.items():
        parameter = parameters.get(key)
        if parameter is None:
            problems.append(SpecProblem(
                f"{where}.args.{key}", "unknown_key",
                f"'{environment_id}' takes no argument '{key}': {taker} {', '.join(parameters) or 'no arguments'}",
            ))
        elif (problem := type_problem(value, parameter)) is not None:
            problems.append(SpecProblem(f"{where}.args.{key}", "invalid_type", f"'{key}' of '{environment_id}' {problem}"))
    return problems
