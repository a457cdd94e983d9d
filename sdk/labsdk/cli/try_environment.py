"""``lab envs try WHEEL_OR_DIR``: load an environment package as a job would, before pushing it.

A project folder is built into a wheel first (``pip wheel --no-deps --no-build-isolation``, with
the build backend this Python has). The package then runs in Lab's engine on this machine, with
no Lab server: ``python -m engine.commands.try_environment`` (the engine's docstring says how)
installs it as a job installs it, probes it and checks ``--args`` as a build and a submit do (the
same messages), loads it with the job's loader, whatever its kind (a Lab-protocol package, a
verifiers v1 taskset, single- or multi-turn, or a ``load_environment`` package), shows its
examples and scores ``--reply`` (or a catalogue model's replies, ``--model``). ``-e KEY=VALUE``
gives a ``load_environment`` environment a variable, such as the secret it reads: only those, none
of the shell's, as a job gives only its secrets.

The engine is the one of the Lab checkout this SDK is installed from (``.venv/bin/lab``), or an
``engine`` this Python imports; the SDK never imports it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labsdk.cli._options import _UsageError
from labsdk.cli._output import EXIT_OK, _print_json
from labsdk.client import Lab
from labsdk.errors import LabError, ProblemDetail

ENGINE_MODULE = "engine.commands.try_environment"
#: The Lab checkout this module lives in when the SDK is installed from one (``sdk/labsdk/cli/``).
_CHECKOUT = Path(__file__).resolve().parents[3]
#: What a project folder's copy leaves out before its wheel is built (caches, builds, environments).
_NOT_COPIED = (".git", ".venv", "venv", "dist", "build", "__pycache__", "*.egg-info", ".tox", ".nox",
               ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules")


def parse_arguments(text: str | None, flag: str = "--args") -> dict[str, Any]:
    """``--args`` as a dict: a JSON object (``{"max_length": 5}``), a TOML inline table
    (``{max_length = 5}``) or TOML lines (``max_length = 5``). Raises _UsageError otherwise."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
        for candidate in (f"args = {text}", text):
            try:
                parsed = tomllib.loads(candidate)
            except tomllib.TOMLDecodeError:
                continue
            value = parsed["args"] if candidate.startswith("args = ") else parsed
            break
    if not isinstance(value, dict):
        raise _UsageError(f"{flag} must be an object, as JSON ('{{\"max_length\": 5}}') or TOML ('{{max_length = 5}}'), not {text!r}")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise _UsageError(f"{flag} holds a value JSON cannot carry (a TOML date or time): a job's args are JSON") from None
    return value


#: Variables the engine and the environment's bridge set themselves (as a job's do): never a -e's.
_PROCESS_VARIABLES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "UV_OFFLINE", "PIP_NO_INDEX", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
})
_PROCESS_PREFIXES = ("PYTHON", "LD_", "LC_")


def parse_variables(pairs: list[str] | None) -> dict[str, str]:
    """``-e KEY=VALUE`` options as ``{KEY: VALUE}`` (the last one of a key wins). Raises _UsageError
    for one without ``=``, with a key that is not a variable's name, with one of Lab's own
    (``LAB_*``), or with one the engine sets for itself and the environment (``PATH``, ``HOME``,
    ``PYTHON*``, the offline switches, ...): each would change the engine that tries the package,
    and a job never gives an environment any of them."""
    variables: dict[str, str] = {}
    for pair in pairs or []:
        name, equals, value = pair.partition("=")
        if not equals or not name.isidentifier():
            raise _UsageError(f"-e {pair}: give KEY=VALUE, such as -e JUDGE_API_KEY=sk-...")
        if name.startswith("LAB_"):
            raise _UsageError(f"-e {name}: LAB_* variables are Lab's own, never given to an environment")
        if name in _PROCESS_VARIABLES or name.startswith(_PROCESS_PREFIXES):
            raise _UsageError(f"-e {name}: the engine sets {name} itself, for the environment as a job's engine does")
        variables[name] = value
    return variables


#: The time a folder's wheel stamps on its files (1980-01-01, the zip format's first day), unless
#: the shell sets ``SOURCE_DATE_EPOCH`` (reproducible-builds.org/specs/source-date-epoch).
REPRODUCIBLE_EPOCH = "315532800"


def package_wheel(path: Path, scratch: Path) -> Path:
    """``path`` itself when it is a wheel, else the wheel built (offline, ``pip wheel --no-deps``)
    from the project folder ``path`` into ``scratch``: the same files build the same bytes again
    (every entry dated ``SOURCE_DATE_EPOCH``, 1980-01-01 unless the shell sets it). Raises
    _UsageError for a path that is neither, LabError (``build_failed``) when the build fails."""
    if path.is_file():
        if path.suffix != ".whl":
            raise _UsageError(f"{path} is neither a wheel (.whl) nor a project folder")
        return path
    if not path.is_dir():
        raise _UsageError(f"{path}: no such file or folder")
    if not (path / "pyproject.toml").is_file() and not (path / "setup.py").is_file():
        raise _UsageError(f"{path} has no pyproject.toml: pass the package's project folder or its wheel")
    source, dist = scratch / "source", scratch / "dist"
    shutil.copytree(path, source, ignore=shutil.ignore_patterns(*_NOT_COPIED))  # the build writes beside the source
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--no-input",
               "--disable-pip-version-check", "-q", "-w", str(dist), str(source)]
    # The same folder builds the same bytes, so pushing it again is the idempotent push, not a
    # conflict: setuptools (bdist_wheel) and hatchling stamp every zip entry with SOURCE_DATE_EPOCH.
    environment = {"SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH, **os.environ}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    wheels = sorted(dist.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip() and not line.startswith("  ")]
        raise LabError(
            f"building a wheel of {path} failed ({' | '.join(lines[-3:])[:500] or 'no wheel'}): build it with the tools "
            f"its [build-system] names (pip wheel --no-deps -w dist {path}) and pass the .whl",
            code="build_failed",
        )
    return wheels[0]


def _engine_command() -> tuple[list[str], dict[str, str]]:
    """The command that runs the engine's side and its environment: the checkout this SDK comes
    from on the path, else an ``engine`` this Python imports. Raises LabError when there is none."""
    environment = dict(os.environ)
    if (_CHECKOUT / "engine" / "commands" / "try_environment.py").is_file():
        environment["PYTHONPATH"] = os.pathsep.join(part for part in (str(_CHECKOUT), environment.get("PYTHONPATH")) if part)
    elif importlib.util.find_spec("engine") is None:
        raise LabError(
            "lab envs try loads the package with Lab's engine, which this Python does not have: "
            "run the lab of a Lab checkout (.venv/bin/lab after make install)",
            code="engine_missing",
        )
    return [sys.executable, "-m", ENGINE_MODULE], environment


def _python(name: str) -> str:
    found = name if os.sep in name else shutil.which(name)
    if not found or not Path(found).exists():
        raise _UsageError(f"--python {name}: no such interpreter")
    return str(Path(found).absolute())


def envs_try(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs try WHEEL_OR_DIR``: show a package's examples and score replies (the module
    docstring); refuses arguments as a submit would, every problem at once (exit 1)."""
    arguments = parse_arguments(args.args)
    variables = parse_variables(args.env)
    python = _python(args.python) if args.python else None
    command, environment = _engine_command()
    environment.update(variables)  # the values travel in the engine's environment, never on its command line
    with tempfile.TemporaryDirectory(prefix="lab-envs-try-") as scratch:
        wheel = package_wheel(Path(args.package), Path(scratch))
        command += [
            "--wheel", str(wheel.absolute()), "--args", json.dumps(arguments), "--n", str(args.n), "--split", args.split,
            "--seed", str(args.seed), "--max-tokens", str(args.max_tokens), "--temperature", str(args.temperature),
            "--max-turns", str(args.max_turns), "--workdir", str(Path(scratch) / "work"),
        ]
        command += [part for reply in args.reply or [] for part in ("--reply", reply)]
        command += ["--model", args.model] if args.model else []
        command += ["--python", python] if python else []
        command += [part for name in variables for part in ("--env", name)]
        result = subprocess.run(command, env=environment, stdout=subprocess.PIPE, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise LabError(f"the engine stopped with exit status {result.returncode} before it answered (its output is above)", code="engine_failed")
    if "error" in answer:
        error = answer["error"]
        problems = [ProblemDetail(problem) for problem in error.get("errors") or []]
        raise LabError(error["message"], code=error["code"], errors=problems, param=problems[0].param if problems else None)
    if args.json:
        _print_json(answer)
    else:
        _print_tried(answer)
    return EXIT_OK


def _number(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _print_tried(answer: dict) -> None:
    environment = answer["environment"]
    kinds = {"lab": "Lab protocol", "v1": "verifiers taskset", "v0": "load_environment (verifiers v0)"}
    turns = ", multi-turn" if environment["multi_turn"] else ""
    print(f"{environment['id']}: {kinds.get(environment['api'], environment['api'])}{turns}")
    if environment["description"]:
        print(f"  {environment['description']}")
    print("  args: " + (" ".join(f"{name}={json.dumps(value)}" for name, value in environment["args"].items()) or "none"))
    # A v1 multi-turn Env records rewards of its own beside its task's: the functions are not the whole reward.
    # A load_environment environment's rubric is, multi-turn and tool ones too.
    if environment["reward_functions"] and (not environment["multi_turn"] or environment["api"] != "v1"):
        terms = " + ".join(f"{_number(function['weight'])} × {function['name']}" for function in environment["reward_functions"])
        print(f"  reward = {terms}")
    for example in answer["examples"]:
        print(f"\nexample {example['index']} ({example['split']})")
        for message in example["messages"]:
            print(_indented(f"[{message['role']}] {message['content']}"))
        if example["answer"]:
            print(_indented(f"answer: {example['answer']}"))
        if example["reply"] is None:
            continue
        for tool in example.get("tools") or []:
            parameters = ", ".join((tool.get("parameters") or {}).get("properties") or {})
            print(_indented(f"tool: {tool['name']}({parameters})" + (f"  {tool['description']}" if tool.get("description") else "")))
        print(_indented(f"reply: {example['reply']}" if "\n" not in example["reply"] else "replies:\n" + example["reply"]))
        scores = "  ".join(f"{name} {_number(score)}" for name, score in example["functions"].items())
        timed_out = "  (timed out)" if example["timed_out"] else ""
        print(_indented(f"reward {_number(example['reward'])}   {scores}{timed_out}"))
    if not answer["examples"]:
        print("\nno examples in this split")


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines() or [""])
