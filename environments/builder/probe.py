"""Import an environment package and load it with its defaults; print what was found as JSON.

Run by the builder (``environments.builder.build``) with the Python of the package's own built
environment (``python -I probe.py MODULE KIND [ENTRY_POINT] OUT``), or, for a Lab-protocol package,
with the engine's Python and the built environment's ``site-packages`` appended to ``sys.path``
(as the engine runs them). Standard library only: it runs beside whatever the package installed.

It writes ``OUT`` (JSON): ``{"api": "v0"|"v1"|"lab", "environment_class": "module.Class",
"parameters": [{"name", "default", "type", "required"}], "dataset_size": int|None,
"eval_dataset_size": int|None, "reward_functions": [{"name", "weight"}], "secrets": [str],
"verifiers_version": str|None}``, or ``{"error": "..."}`` naming what is wrong and its fix.
Exit status 0 either way; anything else is a crash (its traceback is in the log).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import sys
import traceback
from typing import Any


class ProbeError(Exception):
    """The package is not an environment Lab can build; the message says why and what to do."""


def _json_default(value: Any) -> Any:
    """A default as JSON: itself when JSON can hold it, else its repr (marked as such)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return {"repr": repr(value)[:200]}


def _annotation(annotation: Any) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) or repr(annotation)


def _parameters(function: Any) -> list[dict[str, Any]]:
    """``function``'s keyword parameters (``**kwargs`` and ``*args`` left out)."""
    parameters = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        required = parameter.default is inspect.Parameter.empty
        parameters.append({
            "name": parameter.name,
            "default": None if required else _json_default(parameter.default),
            "type": _annotation(parameter.annotation),
            "required": required,
        })
    return parameters


def _size(dataset: Any) -> int | None:
    if dataset is None:
        return None
    try:
        return len(dataset)
    except TypeError:
        return None


def _qualified(value: Any) -> str:
    cls = value if isinstance(value, type) else type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _record_ensure_keys(package: Any, secrets: list[str]) -> None:
    """Replace verifiers' ``ensure_keys`` (v0), where the package reaches it, with one that records
    the keys and never raises: a build has no secrets; a job's are checked against this list.

    Only once the package is imported, and only modules it imported: a package that never
    imports verifiers does not pay for its import here."""

    def ensure_keys(keys: list[str], *args: Any, **kwargs: Any) -> None:
        secrets.extend(key for key in keys if key not in secrets)

    for name in ("verifiers.legacy.utils.config_utils", "verifiers.legacy", "verifiers.utils.config_utils", "verifiers"):
        module = sys.modules.get(name)
        if module is not None and "ensure_keys" in getattr(module, "__dict__", {}):
            module.ensure_keys = ensure_keys
    for name, value in list(vars(package).items()):
        if getattr(value, "__name__", None) == "ensure_keys" and getattr(value, "__module__", "").startswith("verifiers"):
            setattr(package, name, ensure_keys)


def _verifiers_version() -> str | None:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_lab(entry_point: str) -> dict[str, Any]:
    module_name, _, attribute = entry_point.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    info = getattr(target, "info", None)
    rubric = getattr(target, "rubric", None) or ()
    if info is None or not callable(getattr(target, "make_example", None)):
        raise ProbeError(f"{entry_point} is not a Lab environment (a subclass of engine.environments.Environment)")
    return {
        "api": "lab",
        "environment_class": _qualified(target),
        "parameters": [
            {"name": name, "default": _json_default(value), "type": type(value).__name__, "required": False}
            for name, value in dict(info.args).items()
        ],
        "dataset_size": None,
        "eval_dataset_size": None,
        "reward_functions": [{"name": function.name, "weight": float(function.weight)} for function in rubric],
        "secrets": [],
    }


def _taskset(module: Any) -> Any | None:
    """The ``Taskset`` subclass ``module`` exports in ``__all__``, or None."""
    for name in getattr(module, "__all__", ()) or ():
        value = getattr(module, name, None)
        if isinstance(value, type) and any(base.__name__ == "Taskset" for base in value.__mro__[1:]):
            return value
    return None


def _probe_verifiers(module_name: str) -> dict[str, Any]:
    secrets: list[str] = []
    module = importlib.import_module(module_name)
    _record_ensure_keys(module, secrets)
    taskset = _taskset(module)
    if taskset is not None:
        config = getattr(taskset, "config_type", None) or getattr(taskset, "Config", None)
        fields = getattr(config, "model_fields", {}) if config is not None else {}
        return {
            "api": "v1",
            "environment_class": _qualified(taskset),
            "parameters": [
                {"name": name, "default": _json_default(field.default), "type": _annotation(field.annotation), "required": field.is_required()}
                for name, field in fields.items()
                if name not in ("id", "task", "system_prompt")
            ],
            "dataset_size": None,
            "eval_dataset_size": None,
            "reward_functions": [],
            "secrets": secrets,
        }
    load_environment = getattr(module, "load_environment", None)
    if not callable(load_environment):
        raise ProbeError(
            f"the module '{module_name}' is neither a Lab environment (an entry point in [lab.environments]), "
            "a verifiers environment (a load_environment function) nor a verifiers v1 taskset (a Taskset in __all__): "
            "is this a library? Push the environment that uses it, with the library as a dependency"
        )
    environment = load_environment()
    rubric = getattr(environment, "rubric", None)
    names = list(rubric._get_reward_func_names()) if hasattr(rubric, "_get_reward_func_names") else []
    weights = list(rubric._get_reward_weights()) if hasattr(rubric, "_get_reward_weights") else []
    return {
        "api": "v0",
        "environment_class": _qualified(environment),
        "parameters": _parameters(load_environment),
        "dataset_size": _size(getattr(environment, "dataset", None)),
        "eval_dataset_size": _size(getattr(environment, "eval_dataset", None)),
        "reward_functions": [{"name": name, "weight": float(weight)} for name, weight in zip(names, weights, strict=False)],
        "secrets": secrets,
    }


def main(argv: list[str]) -> int:
    module_name, kind, entry_point, out = argv
    try:
        summary = _probe_lab(entry_point) if kind == "lab" else _probe_verifiers(module_name)
        summary["verifiers_version"] = _verifiers_version()
    except ProbeError as error:
        summary = {"error": str(error)}
    except ModuleNotFoundError as error:
        traceback.print_exc()
        summary = {"error": f"importing it needs the module '{error.name}', which none of its requirements installs: add the distribution that provides it to its dependencies"}
    except Exception as error:  # noqa: BLE001 - the package's own code raised: its traceback is the log
        traceback.print_exc()
        summary = {"error": f"loading it raised {type(error).__name__}: {str(error)[:500]}"}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(summary, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
