"""Import an environment package and load it with its defaults; print what was found as JSON.

Run by the builder (``environments.builder.build``) with the Python of the package's own built
environment (``python -I probe.py MODULE KIND [ENTRY_POINT] OUT``), or, for a Lab-protocol package,
with the engine's Python and the built environment's ``site-packages`` appended to ``sys.path``
(as the engine runs them); ``lab envs try`` runs it the same way on a Lab-protocol package
installed in its own folder, and ``summary`` inside a verifiers package's bridge (its ``probe``
request, engine/environments/bridge_protocol.py), which then loads the package
(``engine.commands.try_environment``). Standard library only: it runs beside whatever
the package installed. `is_load_environment_module` tells verifiers' v0 form from its source,
for the builder and ``lab envs try`` alike, without running it.

It writes ``OUT`` (JSON): ``{"api": "v0"|"v1"|"lab", "environment_class": "module.Class",
"parameters": [{"name", "default", "type", "required"}], "dataset_size": int|None,
"eval_dataset_size": int|None, "train_dataset": bool (v0), "reward_functions": [{"name", "weight"}], "secrets": [str],
"verifiers_version": str|None}``, or ``{"error": "..."}`` naming what is wrong and its fix.
A build asks for more (``rollout``): once loaded, a few examples are rolled out against a stub
OpenAI-compatible chat endpoint this process serves on 127.0.0.1 and scored by the environment's
rubric (``smoke_rollout.py``, beside this file), recorded as ``"rollout": {"examples", "rewards",
"seconds", "reply", "unscored"}``; a rollout that raises is the error, its traceback in the log.
Exit status 0 either way; anything else is a crash (its traceback is in the log). ``secrets`` are
the environment variables loading reads as keys: those it declares with ``vf.ensure_keys``, and
``OPENAI_API_KEY`` when it makes an OpenAI client on that default key (a judge's); each reads a
placeholder while it loads (``BUILD_PLACEHOLDER``), so the build needs none of them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sys
import traceback
import typing
import zipfile
from pathlib import Path
from typing import Any


class ProbeError(Exception):
    """The package is not an environment Lab can build; the message says why and what to do."""


#: How the smoke rollout of a loaded environment is made, given the ``smoke_rollout`` module:
#: its ``lab_rollout``, ``v0_rollout`` or ``v1_rollout`` of what was loaded.
MakeRollout = typing.Callable[[Any], Any]


def _smoke_rollout_module() -> Any:
    """``smoke_rollout.py`` from this file's folder, loaded by its path (under ``python -I`` the
    folder is not on ``sys.path``; the builder copies it beside the probe)."""
    spec = importlib.util.spec_from_file_location("smoke_rollout", Path(__file__).resolve().with_name("smoke_rollout.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


#: What a secret the package declares reads while it loads at build: a build has no secrets, and
#: the clients a package makes (a judge's ``AsyncOpenAI``) only need one to be set, never used.
BUILD_PLACEHOLDER = "lab-build-has-no-secrets"


def _record_ensure_keys(package: Any, secrets: list[str], replaced: list[tuple[Any, str, Any]]) -> None:
    """Replace verifiers' ``ensure_keys`` (v0), where the package reaches it, with one that records
    the keys and never raises: a build has no secrets; a job's are checked against this list.
    Each key reads ``BUILD_PLACEHOLDER`` from then on, if unset. Appends ``(owner, name, original)``
    to ``replaced`` for each attribute replaced.

    Only once the package is imported, and only modules it imported: a package that never
    imports verifiers does not pay for its import here."""

    def ensure_keys(keys: list[str], *args: Any, **kwargs: Any) -> None:
        secrets.extend(key for key in keys if key not in secrets)
        for key in keys:
            os.environ.setdefault(key, BUILD_PLACEHOLDER)

    for name in ("verifiers.legacy.utils.config_utils", "verifiers.legacy", "verifiers.utils.config_utils", "verifiers"):
        module = sys.modules.get(name)
        if module is not None and "ensure_keys" in getattr(module, "__dict__", {}):
            replaced.append((module, "ensure_keys", module.ensure_keys))
            module.ensure_keys = ensure_keys
    for name, value in list(vars(package).items()):
        if getattr(value, "__name__", None) == "ensure_keys" and getattr(value, "__module__", "").startswith("verifiers"):
            replaced.append((package, name, value))
            setattr(package, name, ensure_keys)


def _verifiers_version() -> str | None:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_lab(entry_point: str) -> tuple[dict[str, Any], MakeRollout]:
    module_name, _, attribute = entry_point.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    info = getattr(target, "info", None)
    rubric = getattr(target, "rubric", None) or ()
    if info is None or not callable(getattr(target, "make_example", None)):
        raise ProbeError(f"{entry_point} is not a Lab environment (a subclass of lab_environments.Environment)")
    return {
        "api": "lab",
        "description": _one_line(getattr(info, "description", "")),
        "environment_class": _qualified(target),
        "parameters": [
            {"name": name, "default": _json_default(value), "type": type(value).__name__, "required": False}
            for name, value in dict(info.args).items()
        ],
        "dataset_size": None,
        "eval_dataset_size": None,
        "reward_functions": [{"name": function.name, "weight": float(function.weight)} for function in rubric],
        "secrets": [],
        "multi_turn": False,  # Lab's protocol has single-turn examples
    }, lambda smoke: smoke.lab_rollout(target)


def _one_line(text: Any) -> str:
    """``text`` as one line of at most 500 characters; "" for None. The description a package
    gives itself, as the engine's loader reads it (``lab_environments.EnvironmentInfo.description``,
    a v1 taskset's class docstring, a ``load_environment`` module's docstring's first line): what
    ``lab envs`` shows in place of the wheel's Summary."""
    return " ".join(str(text or "").split())[:500]


def _taskset(module: Any) -> Any | None:
    """The ``Taskset`` subclass ``module`` exports in ``__all__``, or None."""
    for name in getattr(module, "__all__", ()) or ():
        value = getattr(module, name, None)
        if isinstance(value, type) and any(base.__name__ == "Taskset" for base in value.__mro__[1:]):
            return value
    return None


def _task_rewards(taskset: type) -> list[dict[str, Any]]:
    """The ``@vf.reward`` methods (``[{"name", "weight"[, "runtime": true]}]``, by descending
    priority then name, as verifiers orders them) of the ``Task`` class the taskset's generic bases
    name (``vf.Taskset[MyTask, MyConfig]``); ``[]`` when none does. ``runtime`` marks one that
    takes a runtime (a ``runtime`` parameter without a default, as verifiers tells them): a job
    scores it in a sandbox of its attempt. Rewards a config plugs in are not seen before a job
    opens the taskset."""
    for klass in taskset.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            for argument in typing.get_args(base):
                if not isinstance(argument, type):
                    continue
                marked: dict[str, Any] = {}
                for owner in reversed(argument.__mro__):  # the most derived wins; an undecorated override removes one
                    for name, function in vars(owner).items():
                        if callable(function) and getattr(function, "reward", None) is True:
                            marked[name] = function
                        elif name in marked:
                            del marked[name]
                if marked:
                    ordered = sorted(marked.items(), key=lambda item: (-getattr(item[1], "reward_priority", 0), item[0]))
                    return [
                        {"name": name, "weight": float(getattr(function, "_vf_weight", 1.0)), **({"runtime": True} if _takes_runtime(function) else {})}
                        for name, function in ordered
                    ]
    return []


def _takes_runtime(function: Any) -> bool:
    parameter = inspect.signature(function).parameters.get("runtime")
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _v1_multi_turn(module: Any, taskset: type, config: Any) -> bool:
    """Whether a v1 taskset's episodes have several turns, as the verifiers bridge runs them: its
    module exports a ``vf.Env`` of its own (not verifiers' ``SingleAgentEnv``), or its tasks use
    tools (``Taskset.toolsets``/``Task.toolsets`` with the default config)."""
    import verifiers.v1 as vf

    for name in getattr(module, "__all__", None) or []:
        exported = getattr(module, name, None)
        if isinstance(exported, type) and issubclass(exported, vf.Env) and not issubclass(exported, vf.SingleAgentEnv):
            return True
    try:
        defaults = config() if config is not None else None
        return bool(taskset.toolsets(defaults) or taskset.task_type().toolsets(defaults.task))
    except Exception:  # noqa: BLE001 - the package's own code: a taskset whose tools cannot be listed so
        return False


def _taskset_config(taskset: Any, module_name: str) -> Any | None:
    """The config class of the taskset that ``module_name`` exports: verifiers' own resolution
    (``taskset_config_type``, the ``TasksetConfig`` its generic bases name, verifiers 0.4.0), else
    a ``config_type`` or ``Config`` attribute."""
    try:
        from verifiers.v1.utils.loaders import taskset_config_type
    except ImportError:
        return getattr(taskset, "config_type", None) or getattr(taskset, "Config", None)
    return taskset_config_type(module_name)


def _probe_verifiers(module_name: str, replaced: list[tuple[Any, str, Any]]) -> tuple[dict[str, Any], MakeRollout]:
    secrets: list[str] = []
    module = importlib.import_module(module_name)
    _record_ensure_keys(module, secrets, replaced)
    taskset = _taskset(module)
    if taskset is not None:
        config = _taskset_config(taskset, module_name)
        fields = getattr(config, "model_fields", {}) if config is not None else {}
        multi_turn = _v1_multi_turn(module, taskset, config)
        return {
            "api": "v1",
            "description": _one_line(taskset.__doc__),
            "environment_class": _qualified(taskset),
            "parameters": [
                {"name": name, "default": _json_default(field.default), "type": _annotation(field.annotation), "required": field.is_required()}
                for name, field in fields.items()
                if name not in ("id", "task", "system_prompt")
            ],
            "dataset_size": None,
            "eval_dataset_size": None,
            "reward_functions": _task_rewards(taskset),
            "secrets": secrets,
            "multi_turn": multi_turn,
        }, lambda smoke: smoke.v1_episodes_rollout(module_name) if multi_turn else smoke.v1_rollout(taskset, config)
    load_environment = getattr(module, "load_environment", None)
    if not callable(load_environment):
        raise ProbeError(
            f"the module '{module_name}' is neither a Lab environment (an entry point in [lab.environments]), "
            "a verifiers environment (a load_environment function) nor a verifiers v1 taskset (a Taskset in __all__): "
            "is this a library? Push the environment that uses it, with the library as a dependency"
        )
    try:
        environment = load_environment()
    except Exception as error:  # noqa: BLE001 - the package's own code; re-raised unless it only wants OpenAI's key
        if type(error).__name__ != "OpenAIError" or "OPENAI_API_KEY" not in str(error) or "OPENAI_API_KEY" in os.environ:
            raise
        # A client made with OpenAI's default key (a judge's AsyncOpenAI()): the key is a secret it reads.
        secrets.append("OPENAI_API_KEY")
        os.environ["OPENAI_API_KEY"] = BUILD_PLACEHOLDER
        environment = load_environment()
    bridge = _smoke_rollout_module().sibling("load_environment_bridge.py")  # tells its kinds apart as a job's bridge does
    return {
        "api": "v0",
        "description": _one_line((module.__doc__ or "").strip().split("\n")[0]),
        "environment_class": _qualified(environment),
        "parameters": _parameters(load_environment),
        "dataset_size": _size(getattr(environment, "dataset", None)),
        "eval_dataset_size": _size(getattr(environment, "eval_dataset", None)),
        # False for an eval dataset only (built, or a builder verifiers calls later): it evaluates, it does not train.
        "train_dataset": any(getattr(environment, name, None) is not None for name in ("dataset", "dataset_source")),
        "reward_functions": [{"name": name, "weight": weight} for name, weight in bridge.reward_functions(environment)],
        "secrets": secrets,
        "multi_turn": not bridge.is_single_turn(environment),
    }, lambda smoke: smoke.v0_rollout(environment)


def module_source(wheel: str | os.PathLike, module: str) -> str:
    """The source of the package's top-level module (``module/__init__.py`` or ``module.py``), or ``""``."""
    with zipfile.ZipFile(wheel) as archive:
        for name in (f"{module}/__init__.py", f"{module}.py"):
            try:
                return archive.read(name).decode("utf-8", errors="replace")
            except KeyError:
                continue
    return ""


def is_load_environment_module(source: str) -> bool:
    """Whether a module defines or imports ``load_environment`` at top level and names no ``Taskset``
    (verifiers' v0 form, which verifiers 0.4.0 no longer runs), read without running it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    defines = any(
        (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "load_environment")
        or (isinstance(node, ast.ImportFrom) and any((alias.asname or alias.name) == "load_environment" for alias in node.names))
        for node in tree.body
    )
    return defines and "Taskset" not in source


def not_in_engine(what: str, *, plural: bool = False) -> str:
    """The one message for a dependency a job would not find: ``what`` (``"it needs the module
    'math_verify'"``), then why and what to do. A job installs a Lab-protocol or verifiers v1
    package with ``--no-deps`` beside the engine's (or the verifiers) environment, so the build,
    ``lab envs try`` and the job itself all refuse such a package with these words."""
    verb = "are" if plural else "is"
    return (
        f"{what}, which {verb} not installed in the engine's environment: a job installs the package with --no-deps, "
        "so every dependency must already be there (depend only on what the engine's environment holds, put the code "
        "in the package, or have the distribution added to Lab's requirements)"
    )


def dataset_loaded_by_name(error: BaseException) -> str | None:
    """The name ``datasets.load_dataset`` was called with where ``error`` was raised, when it names
    a Hub dataset (``owner/name``) that is no folder here: offline, with no pushed snapshot of
    that name in the working directory (``environments.datasets``), ``datasets`` raises its own
    "Couldn't reach ... on the Hub" error, which says nothing of Lab. Read from the frames of the
    traceback (``load_dataset``'s ``path`` argument), so any ``datasets`` version is read alike."""
    frames = []
    traceback_ = error.__traceback__
    while traceback_ is not None:
        frames.append(traceback_.tb_frame)
        traceback_ = traceback_.tb_next
    for frame in frames:
        filename = frame.f_code.co_filename.replace(os.sep, "/")
        if frame.f_code.co_name == "load_dataset" and filename.endswith("datasets/load.py"):
            path = frame.f_locals.get("path")
            if isinstance(path, str) and path.count("/") == 1 and not os.path.isdir(path):
                return path
    return None


def unpushed_dataset_message(name: str, hub: str | None = None) -> str:
    """What a build (or a job) whose environment loads the dataset ``name`` by name, not pushed, is told;
    ``hub`` the Hugging Face endpoint the build fetched datasets from (default ``LAB_HF_ENDPOINT``,
    the endpoint as Lab is configured with it, else ``HF_ENDPOINT``, which a build's network may
    have rewritten, where the Hub was not switched off; else none: it loaded offline)."""
    if hub is None:
        configured = os.environ.get("LAB_HF_ENDPOINT") or os.environ.get("HF_ENDPOINT", "")
        hub = configured if os.environ.get("HF_DATASETS_OFFLINE") != "1" else ""
    where = (
        f"which is neither a dataset the organization pushed nor one the build could fetch from {hub} (the log has its answer)"
        if hub else "and Lab loads environments offline, where a dataset named so is one the organization pushed"
    )
    return (
        f"loading it calls load_dataset(\"{name}\"), {where}: push its files with `lab datasets push {name} DIR|FILE` (a folder such as the dataset's "
        "repository: train.jsonl, data/test-00000.parquet, ...), then build the environment again (`lab envs rebuild ID`)"
    )


def summary(module_name: str, kind: str, entry_point: str, *, as_job: bool, smoke: bool = False) -> dict[str, Any]:
    """Import the module ``module_name`` (``kind`` "lab": the class ``entry_point`` names), load it
    with its defaults and return what ``OUT`` holds (the module docstring): the summary, or
    ``{"error": ...}``. ``as_job``: the package was installed as a job installs it (no
    dependencies), so a missing module is one the engine lacks; ``smoke`` (a build): a smoke
    rollout follows the loading (``run_rollout``: the summary's ``rollout``), and one that raises
    is the error (``rollout_failed_message``).

    What loading changed of this process for a build (the variables set to ``BUILD_PLACEHOLDER``,
    verifiers' ``ensure_keys`` replaced) is put back before it returns, so a bridge that probes a
    package in its own process (``lab envs try``, engine/environments/bridge_protocol.py) then
    loads it as a job would."""
    environ = dict(os.environ)
    replaced: list[tuple[Any, str, Any]] = []
    try:
        found, make_rollout = _probe_lab(entry_point) if kind == "lab" else _probe_verifiers(module_name, replaced)
        found["verifiers_version"] = _verifiers_version()
        if smoke:
            rollouts = _smoke_rollout_module()
            try:
                found["rollout"] = rollouts.run_rollout(make_rollout(rollouts))
            except Exception as error:  # noqa: BLE001 - the package's own code raised: its traceback is the log
                traceback.print_exc()
                found = {"error": rollouts.rollout_failed_message(error)}
    except ProbeError as error:
        found = {"error": str(error)}
    except ModuleNotFoundError as error:
        traceback.print_exc()
        needs = f"importing it needs the module '{error.name}'"
        found = {"error": not_in_engine(needs) if as_job else f"{needs}, which none of its requirements installs: add the distribution that provides it to its dependencies"}
    except Exception as error:  # noqa: BLE001 - the package's own code raised: its traceback is the log
        traceback.print_exc()
        name = dataset_loaded_by_name(error)
        found = {"error": unpushed_dataset_message(name) if name else f"loading it raised {type(error).__name__}: {str(error)[:500]}"}
    finally:
        for owner, name, original in reversed(replaced):
            setattr(owner, name, original)
        for name in [name for name in os.environ if environ.get(name) != os.environ[name]]:
            if name in environ:
                os.environ[name] = environ[name]
            else:
                del os.environ[name]
    return found


def main(argv: list[str]) -> int:
    """``MODULE KIND ENTRY_POINT OUT [engine] [rollout]``: write ``summary``'s answer to ``OUT``,
    ``engine`` its ``as_job``, ``rollout`` its ``smoke``."""
    module_name, kind, entry_point, out = argv[:4]
    found = summary(module_name, kind, entry_point, as_job="engine" in argv[4:], smoke="rollout" in argv[4:])
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(found, handle)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
