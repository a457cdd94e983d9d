"""Environments: the protocol (``lab_environments``), the built-ins and the registry.

`load_environment` finds an environment by id among the built-ins (`lab/addition`,
`lab/reverse-text`, `lab/alphabet-sort`, `lab/python-code`, which runs the model's code in Lab
sandboxes) and the environments of the job's packages, which
engine.packages installs and registers here (`register_installed`). The protocol's names are
defined in the ``lab-environments`` distribution, which packages import them from
(``from lab_environments import Environment, ...``); they are re-exported here too, so that
packages written against ``engine.environments`` keep working.
"""

from __future__ import annotations

from engine.catalog import list_environments
from engine.environments.addition import Addition
from engine.environments.alphabet_sort import AlphabetSort
from engine.environments.base import (
    EVAL_BUCKET,
    MAX_SPLIT_DRAWS,
    SPLIT_BUCKETS,
    SPLITS,
    VAL_BUCKET,
    Environment,
    EnvironmentFailed,
    EnvironmentInfo,
    Example,
    InvalidEnvironment,
    RewardFunction,
    Scores,
    retry_allowed,
    split_of,
)
from engine.environments.python_code import PythonCode
from engine.environments.reverse_text import ReverseText

__all__ = [
    "EVAL_BUCKET", "MAX_SPLIT_DRAWS", "SPLIT_BUCKETS", "SPLITS", "VAL_BUCKET", "Environment", "EnvironmentFailed",
    "EnvironmentInfo", "Example", "InvalidEnvironment", "RewardFunction", "Scores", "check_args", "load_environment", "register_installed",
    "retry_allowed",
    "split_of",
]


#: The built-in environments by id.
BUILT_IN: dict[str, type[Environment]] = {cls.info.id: cls for cls in (Addition, ReverseText, AlphabetSort, PythonCode)}
#: The environments of the job's installed packages (Lab-protocol or verifiers) by id.
_INSTALLED: dict[str, type[Environment]] = {}


def register_installed(environment_id: str, cls: type[Environment]) -> None:
    """Make an installed package's Environment class loadable by `environment_id`."""
    _INSTALLED[environment_id] = cls


def check_args(info: EnvironmentInfo, args: dict) -> None:
    """Raise InvalidEnvironment unless every key of `args` is a default's key of the same JSON type
    (a default of None, a `load_environment` parameter's with no JSON default, takes any value)."""
    for key, value in args.items():
        if key not in info.args:
            raise InvalidEnvironment(
                f"{info.id} has no argument {key!r} (allowed: {', '.join(sorted(info.args))})"
            )
        default = info.args[key]
        if default is None:
            continue
        same_type = type(value) is type(default) or (
            isinstance(default, float) and type(value) is int
        )
        if not same_type:
            raise InvalidEnvironment(
                f"{info.id} argument {key!r} must be of type {type(default).__name__}, not {value!r}"
            )


def load_environment(env_id: str, args: dict | None = None, seed: int = 0) -> Environment:
    """Instantiate an installed environment by id with the job's args and seed.

    Raises InvalidEnvironment for an id that is not installed or invalid args.
    """
    cls = BUILT_IN.get(env_id) or _INSTALLED.get(env_id)
    if cls is None:
        installed = ", ".join(sorted(list_environments()))
        raise InvalidEnvironment(f"environment {env_id!r} is not installed (installed: {installed})")
    check_args(cls.info, dict(args or {}))
    return cls(dict(args or {}), seed)
