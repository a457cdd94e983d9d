"""``lab envs try``'s engine side: load one environment package as a job would, show its examples
and score replies, with no Lab.

    python -m engine.commands.try_environment --wheel FILE [--args JSON] [--n 3] [--split train]
        [--seed 0] [--reply TEXT | --model ID] [--max-tokens 64] [--temperature 1.0] [--max-turns 8]
        [--python PYTHON] [--env NAME ...] [--workdir DIR]

The package goes the job's way (``engine.packages``): its wheel is installed with ``--no-deps``
into a folder of its own, then its kind decides how it loads, as at push and in a job: a
``lab.environments`` entry point is a Lab-protocol package, imported here; a verifiers package
whose module defines ``load_environment`` (verifiers' v0 API) runs its bridge with ``--python``,
the Python of an environment that holds its requirements, as a job runs it on its build's; any
other verifiers package (a v1 taskset, single- or multi-turn) runs the verifiers bridge with the
engine's verifiers environment (``LAB_ENGINE_VERIFIERS_PYTHON``, or ``--python``). Before it
loads, the package is probed as its build would probe it (``engine.environments.probe``): a
Lab-protocol package in a process of its own, a verifiers package in the bridge it then loads in
(the bridge's ``probe`` request), so verifiers and the package are imported once; the arguments
are checked against what the probe recorded with the words of a submit
(``labsdk.spec.argument_problems``); then the engine's own ``load_environment`` makes it. A
``load_environment`` package's bridge is given the variables ``--env`` names (their values are in
this process's environment), as a job gives its secrets, and no other of them: a secret it declares
(``vf.ensure_keys``) that ``--env`` does not name is refused before it loads.

Every example of ``--n`` is shown (``Environment.example(index, split)``); ``--reply`` scores the
same text as every example's reply; in a multi-turn environment ``--reply`` may be given once per
turn (turn N of every episode answers with the Nth, the last one answering every later turn, so a
tool-using episode can call a tool, then answer), ``--model
samples the replies with a catalogue model on this machine's CPU (which needs torch), neither
shows the examples alone. Prints one JSON object on stdout: ``{"environment": {"id", "kind",
"api", "description", "args", "parameters", "reward_functions", "multi_turn"}, "examples":
[{"index", "split", "messages", "answer", "info", "reply", "reward", "functions", "turns",
"timed_out", "tools"}]}`` (``tools``: the tools offered to the model in the episode, ``[{"name",
"description", "parameters"}]``, with the names the model calls them by) (reply fields null without a reply), or ``{"error": {"code", "message",
"errors"}}`` with exit status 2 (``invalid_spec``: arguments the package does not take;
``environment_error``: it cannot load, or its code failed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from labsdk.spec import argument_problems
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from engine.catalog import list_models
from engine.commands.common import EXIT_INVALID, EXIT_SUCCEEDED
from engine.config import set_variable, setting
from engine.environments import EnvironmentFailed, InvalidEnvironment, load_environment, probe
from engine.environments.verifiers_taskset import (
    PYTHON_VARIABLE,
    Bridge,
    BridgeFailed,
    BridgeRefused,
    close_bridges,
    verifiers_python,
)
from engine.packages import Package, entry_point_of, install_wheels, load_packages, start_bridge

#: The owner of a package tried before it is pushed (its id is ``local/<name>@<version>``).
LOCAL_OWNER = "local"
#: Seconds the probe may take to import and load the package.
PROBE_TIMEOUT_S = 300
#: The repository root: a Lab-protocol package is probed with the engine's code on its path.
_ENGINE_ROOT = Path(__file__).resolve().parents[2]


class TryFailed(Exception):
    """The package cannot be tried as asked: ``code`` and ``message`` (and ``errors``, the
    problems of its arguments) are the JSON error's."""

    def __init__(self, code: str, message: str, errors: list[dict] | None = None):
        super().__init__(message)
        self.code, self.message, self.errors = code, message, errors or []


def _package(wheel: Path) -> Package:
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as error:
        raise TryFailed("environment_error", f"{wheel.name} is not a wheel's file name: {error}") from None
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return Package(id=f"{LOCAL_OWNER}/{canonicalize_name(name)}@{version}", sha256=digest, url=wheel.resolve().as_uri(), filename=wheel.name)


def _probe(package: Package, site: Path, wheel: Path, workdir: Path, python: Path | None, given: list[str]) -> tuple[str, dict, Bridge | None]:
    """Probe the installed package as its build would; return ``(kind, summary, bridge)``: kind
    "lab" or "verifiers", the probe's summary with ``api`` and ``parameters``, and the bridge a
    verifiers package was probed in (`_probe_in_bridge`), which then loads it (None for a
    Lab-protocol package, probed in a process of its own)."""
    entry_point = entry_point_of(package, site)
    module = package.name.replace("-", "_")
    if entry_point is not None:  # in the engine's own process, as a job imports it
        return "lab", _probe_lab(module, entry_point, site, workdir), None
    version_zero = probe.is_load_environment_module(probe.module_source(wheel, module))
    if version_zero and python is None:
        raise TryFailed(
            "environment_error",
            f"{package.id.split('/', 1)[1]} defines load_environment (verifiers' v0 API), which a job runs on its build's "
            "environment: pass --python, the Python of an environment that holds its requirements (verifiers<0.4 and the rest), "
            "such as one made with `python3 -m venv /tmp/v0-env && /tmp/v0-env/bin/pip install 'verifiers<0.4' datasets` "
            "(and the package's own requirements; offline: docs/environments.md, \"Trying a package before pushing\")",
        )
    interpreter = python or verifiers_python()
    if not interpreter.exists():
        raise TryFailed("environment_error", f"{interpreter} does not exist (`make install` creates .venv-verifiers; --python names another)")
    return "verifiers", *_probe_in_bridge(_as_tried(package, version_zero, given), site, module, python, version_zero)


def _as_tried(package: Package, version_zero: bool, given: list[str]) -> Package:
    """``package`` as ``lab envs try`` loads it: a ``load_environment`` one (``version_zero``) on
    a build of verifiers' v0 API whose bridge is given the variables ``given`` names (`_secrets`)."""
    if not version_zero:
        return package
    return Package(id=package.id, sha256=package.sha256, url=package.url, filename=package.filename,
                   build={"number": None, "api": "v0", "lock": [], "secrets": given})


def _probe_in_bridge(package: Package, site: Path, module: str, python: Path | None, version_zero: bool) -> tuple[dict, Bridge | None]:
    """Start the bridge the verifiers ``package`` runs in (its ``load_environment`` bridge on
    ``python`` when ``version_zero``, else the verifiers bridge, on ``python`` when given) and
    probe the package in it (the ``probe`` request, as its build probes it): the package and
    verifiers are imported once, for the probe and the examples alike. Return the summary and
    the bridge (None when the probe found the other kind of package). Raises TryFailed, InvalidEnvironment when the bridge cannot start."""
    if python is not None and not version_zero:
        set_variable(PYTHON_VARIABLE, str(python))  # the verifiers bridge's interpreter
    bridge = start_bridge(package, site, build_python=python)
    try:
        summary = bridge.request("probe", timeout=PROBE_TIMEOUT_S, module=module, as_job=not version_zero)
    except BridgeFailed as error:
        raise TryFailed("environment_error", f"importing and loading the package failed: {error}") from None
    except BridgeRefused as refusal:
        raise TryFailed("environment_error", f"importing and loading the package failed: {refusal}") from None
    if summary.get("error"):
        raise TryFailed("environment_error", summary["error"])
    if (summary["api"] == "v0") != version_zero:  # read as one kind from its source, probed as the other
        bridge.close()  # loaded as the probe found it, in the bridge of that kind
        return summary, None
    return summary, bridge


def _probe_lab(module: str, entry_point: str, site: Path, workdir: Path) -> dict:
    """Probe the Lab-protocol package ``module`` (its class ``entry_point``) with the engine's
    Python in a process of its own; return its summary. Raises TryFailed."""
    environment = {
        "PATH": setting("PATH", os.defpath), "HOME": str(workdir), "LANG": "C.UTF-8", "TMPDIR": str(workdir),
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "UV_OFFLINE": "1", "PIP_NO_INDEX": "1",
        "PYTHONPATH": os.pathsep.join([str(_ENGINE_ROOT), str(site)]),
    }
    out = workdir / "probe.json"
    # installed as a job installs it ("engine"): a missing module is one the engine lacks
    command = [sys.executable, "-s", probe.__file__, module, "lab", entry_point, str(out), "engine"]
    try:
        result = subprocess.run(command, cwd=workdir, env=environment, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise TryFailed("environment_error", f"importing and loading the package took more than {PROBE_TIMEOUT_S} s") from None
    if result.returncode != 0 or not out.is_file():
        tail = " | ".join(line for line in result.stderr.splitlines()[-3:] if line.strip())
        raise TryFailed("environment_error", f"importing and loading the package crashed (exit {result.returncode}): {tail[:500]}")
    summary = json.loads(out.read_text())
    if summary.get("error"):
        raise TryFailed("environment_error", summary["error"])
    return summary


def _check_arguments(package: Package, args: dict, summary: dict) -> None:
    """Refuse what a submit refuses (``labsdk.spec.argument_problems``), every problem at once."""
    problems = argument_problems("env.0", SimpleNamespace(args=args), package.id.split("/", 1)[1], summary)
    if problems:
        errors = [{"param": problem.param, "code": problem.code, "message": problem.message} for problem in problems]
        message = problems[0].message if len(problems) == 1 else f"{len(problems)} problems"
        raise TryFailed("invalid_spec", message, errors)


def _secrets(package: Package, summary: dict, given: list[str]) -> list[str]:
    """The names of the variables the bridge is given: those ``--env`` names, which must hold every
    secret the probe recorded (``summary["secrets"]``): the shell's own value of a secret is never
    taken unasked. Raises TryFailed when one is missing."""
    declared = list(summary.get("secrets") or [])
    missing = [name for name in declared if name not in given]
    if missing:
        raise TryFailed(
            "environment_error",
            f"{package.id.split('/', 1)[1]} reads the secret{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"(vf.ensure_keys): give {'each' if len(missing) > 1 else 'it'} with -e {missing[0]}=...",
        )
    return given


def try_package(options: argparse.Namespace) -> dict:
    """Load the package of ``options.wheel`` as a job would and score its examples (the module
    docstring); return the JSON object to print. Raises TryFailed."""
    wheel = Path(options.wheel)
    if not wheel.is_file():
        raise TryFailed("environment_error", f"{wheel}: no such file")
    if options.model and options.model not in list_models():  # refused before the package loads, as it would be after
        raise TryFailed("model_not_found", f"unknown model {options.model!r}: see `lab models`")
    package = _package(wheel)
    workdir = Path(options.workdir)
    site = install_wheels([package], workdir)
    given = list(options.env or [])
    kind, summary, bridge = _probe(package, site, wheel, workdir, options.python, given)
    _check_arguments(package, options.args, summary)
    build_python = None
    if summary["api"] == "v0":
        _secrets(package, summary, given)
        package = _as_tried(package, True, given)
        build_python = options.python
    elif given:
        raise TryFailed(
            "environment_error",
            f"-e gives variables to a load_environment environment's bridge; {package.id.split('/', 1)[1]} is "
            f"{'a Lab-protocol package' if kind == 'lab' else 'a verifiers taskset'}, which a job gives none",
        )
    elif options.python is not None:
        set_variable(PYTHON_VARIABLE, str(options.python))  # the verifiers bridge's interpreter
    load_packages([package], site, build_python=build_python, bridges={package.id: bridge} if bridge else None)
    env = load_environment(package.id, options.args, seed=options.seed)
    env.limits = {"max_turns": options.max_turns, "max_input_tokens": None, "max_output_tokens": None}
    examples = []
    for index in range(options.n):
        try:
            examples.append(env.example(index, options.split))
        except (IndexError, KeyError):  # a bounded dataset with fewer examples in the split
            break
    rows = [
        {"index": index, "split": options.split, "messages": example.messages, "answer": example.answer, "info": example.info,
         "reply": None, "reward": None, "functions": None, "turns": None, "timed_out": None, "tools": None}
        for index, example in enumerate(examples)
    ]
    if options.reply is not None or options.model:
        for row, scored in zip(rows, _score(env, examples, options), strict=True):
            row.update(scored)
    return {
        "environment": {
            "id": package.id.split("/", 1)[1], "kind": kind, "api": summary["api"], "description": env.info.description,
            "args": env.args, "parameters": summary.get("parameters") or [],
            "reward_functions": [{"name": function.name, "weight": function.weight} for function in env.rubric],
            "multi_turn": bool(env.multi_turn),
        },
        "examples": rows,
    }


def _score(env, examples: list, options: argparse.Namespace) -> list[dict]:
    """Each example's reply and its scores: ``options.reply`` for every reply, or ``options.model``'s."""
    if options.model:
        try:
            from engine.commands import try_model  # torch: only a reply sampled by a model needs it
        except ImportError as error:
            raise TryFailed(
                "environment_error",
                f"--model samples the replies with Lab's engine on this machine, which needs {error.name or 'torch'} "
                f"({error}): install Lab's requirements (make install), or score a --reply instead",
            ) from None
        try:
            return try_model.score_with_model(env, examples, options)
        except try_model.ModelNotFound as error:
            raise TryFailed("model_not_found", f"{error.args[0] if error.args else error}: see `lab models`") from None
        except try_model.RequestError as error:
            raise TryFailed("environment_error", f"the model cannot take an example's prompt: {error}") from None
    if env.multi_turn:
        return reply_episodes(env, examples, options.reply)
    if len(options.reply) > 1:
        raise TryFailed(
            "invalid_request",
            f"{len(options.reply)} replies (--reply) for a single-turn environment, whose episodes have one turn: give one --reply",
        )
    results = []
    for example in examples:
        scores = env.score_rollout(options.reply[0], example)
        results.append({"reply": options.reply[0], "reward": scores.reward, "functions": scores.functions, "turns": 1,
                        "timed_out": scores.timed_out})
    return results


def transcript(messages: list[dict]) -> str:
    """``messages`` as text blocks ``[role]\\ncontent``, as verifiers' ``Trace.transcript`` writes them."""
    return "\n\n".join(f"[{message['role']}]\n{message['content']}" for message in messages)


def reply_episodes(env, examples: list, replies: list[str]) -> list[dict]:
    """Run one episode of each example of the multi-turn ``env``, within ``env.limits``, each
    agent's turn N of an episode answered with ``replies[N]`` (0-based; the last one for every turn
    past the list); return each one's conversation after its opening, reward, functions, turns and
    the tools its turns offered (``[{"name", "description", "parameters"}]``, empty without tools).
    Raises EnvironmentFailed for an episode whose code failed."""
    answer = env.start_episodes([example.info["task_id"] for example in examples], env.limits)
    rows = {episode: row for row, episode in enumerate(answer["episodes"])}
    conversations: dict[str, list[dict]] = {}
    openings: dict[str, int] = {}
    results: dict[int, dict] = {}
    turns: dict[tuple[str, bool], int] = {}  # (episode, trainable): the turns answered so far
    tools: dict[str, dict[str, dict]] = {}  # episode: the tools its trainable turns offered, by name
    while True:
        for finished in answer["finished"]:
            if finished.get("error"):
                raise EnvironmentFailed(f"environment {env.id}: an episode failed: {finished['error']}")
            conversation = conversations.get(finished["episode"], [])
            results[rows[finished["episode"]]] = {
                "reply": transcript(conversation[openings.get(finished["episode"], 0):]), "reward": float(finished["reward"]),
                "functions": finished["functions"], "turns": finished.get("turns"), "timed_out": bool(finished.get("timeout")),
                "tools": list(tools.get(finished["episode"], {}).values()),
            }
        if not answer["requests"]:
            break
        answers = []
        for request in answer["requests"]:
            seat = (request["episode"], bool(request["trainable"]))
            reply = replies[min(turns.get(seat, 0), len(replies) - 1)]
            turns[seat] = turns.get(seat, 0) + 1
            if request["trainable"]:
                for spec in request.get("tools") or []:
                    function = spec.get("function", spec)
                    tools.setdefault(request["episode"], {})[function["name"]] = {
                        "name": function["name"], "description": function.get("description") or "",
                        "parameters": function.get("parameters") or {},
                    }
                openings.setdefault(request["episode"], len(request["messages"]))
                conversations[request["episode"]] = [*request["messages"], {"role": "assistant", "content": reply}]
            answers.append({"request": request["request"], "text": reply, "input_tokens": 0, "output_tokens": 0})
        answer = env.reply(answers)
    return [results[row] for row in range(len(examples))]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.commands.try_environment", description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", required=True, help="the package's wheel")
    parser.add_argument("--args", type=json.loads, default={}, help="the [[env]] args as a JSON object")
    parser.add_argument("--n", type=int, default=3, help="examples to show (default 3)")
    parser.add_argument("--split", choices=("train", "eval", "val"), default="train")
    parser.add_argument("--seed", type=int, default=0)
    replies = parser.add_mutually_exclusive_group()
    replies.add_argument("--reply", action="append", help="score this text as every example's reply; multi-turn: once per turn, the last for later turns")
    replies.add_argument("--model", help="sample the replies with this catalogue model (needs torch)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per sampled reply (--model)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (--model)")
    parser.add_argument("--max-turns", type=int, default=8, help="turns of a multi-turn episode (default 8)")
    parser.add_argument("--python", type=Path, help="the Python that runs a verifiers package's bridge")
    parser.add_argument("--env", action="append", metavar="NAME", help="give the bridge this variable of this process's environment")
    parser.add_argument("--workdir", help="where the package is installed (default a temporary folder)")
    options = parser.parse_args(argv)
    if not isinstance(options.args, dict):
        parser.error("--args must be a JSON object")
    return options


def main(argv: list[str] | None = None) -> int:
    """Run ``try_package`` and print its JSON; return the exit status (0, or 2 with an error)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    options = _arguments(argv)
    temporary = None if options.workdir else tempfile.mkdtemp(prefix="lab-envs-try-")
    options.workdir = options.workdir or temporary
    try:
        print(json.dumps(try_package(options)))
        return EXIT_SUCCEEDED
    except TryFailed as error:
        print(json.dumps({"error": {"code": error.code, "message": error.message, "errors": error.errors}}))
    except (InvalidEnvironment, EnvironmentFailed) as error:
        print(json.dumps({"error": {"code": "environment_error", "message": str(error), "errors": []}}))
    finally:
        close_bridges()  # before their work dir goes
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
