"""verifiers v1 tasksets as engine environments, driven through the verifiers bridge.

verifiers (0.4.0) lives in its own virtual environment (``.venv-verifiers``,
requirements-verifiers.txt): its pins (transformers 5.24, mcp 2.0.0) clash with the engine's. The
engine therefore never imports it; it starts ``engine/environments/verifiers_bridge.py`` with that
environment's Python, once per uploaded verifiers package, and talks JSON lines to it (the
protocol is in the bridge's docstring).

For single-turn tasksets the engine drives each episode itself: the bridge hands out the
taskset's tasks as chat messages, the trainer renders them through the policy tokenizer's chat
template and samples completions with Lab's own rollout backend, and the bridge scores each
completion with the task's own reward functions (``await task.score(trace)``, offline, as
``vf-replay`` does; a reward function that takes a runtime runs in a box of verifiers' ``prime``
runtime on Lab's sandboxes of the attempt, one per rollout, whose access the engine gives the
bridge: ``VerifiersTaskset._give_sandboxes``). Every reward function's score is reported as
``reward/<env>/<function>/mean``; the rollout's reward is verifiers' ``trace.reward`` (the sum of
score x weight).

A package that exports its own ``vf.Env`` subclass is multi-turn: the bridge runs that Env's own
``run_episode`` with agents whose turns the engine answers with Lab's policy, a round of all the
step's pending turns at a time (engine/multi_turn.py), and the rollout's reward is the trainable
agent's ``trace.reward``: what the Env recorded and the task's own reward functions.

The bridge runs in the attempt's work dir, with a minimal environment (no Lab variable, no job
secret, offline switches on), in its own process group; it ends when the engine closes its stdin,
when the engine exits (``close_bridges`` at exit; on Linux the bridge also asks the kernel for
``PR_SET_PDEATHSIG``), or is killed with its group.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path

from engine import sandboxes
from engine.catalog import EnvironmentInfo
from engine.config import environment
from engine.environments.base import Environment, EnvironmentFailed, Example, InvalidEnvironment, RewardFunction, Scores
from engine.environments.bridge_protocol import runtime_rewards_phrase

logger = logging.getLogger("engine")

#: The verifiers environment's Python: LAB_ENGINE_VERIFIERS_PYTHON, else the repository's .venv-verifiers.
PYTHON_VARIABLE = "LAB_ENGINE_VERIFIERS_PYTHON"
DEFAULT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
BRIDGE_SCRIPT = Path(__file__).resolve().with_name("verifiers_bridge.py")
#: The bridge of verifiers' v0 API (``load_environment``), run with the Python of the package's build.
LOAD_ENVIRONMENT_BRIDGE_SCRIPT = Path(__file__).resolve().with_name("load_environment_bridge.py")
#: Seconds the bridge may take to start (import verifiers) and to answer one request.
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0
#: Tasks fetched from the bridge per request.
TASK_CHUNK = 64
#: Variables the bridge inherits from the engine; everything else (LAB_*, the job's secrets) stays out.
_BRIDGE_ENV_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR")
_BRIDGE_ENV_FIXED = {
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    # Nothing a taskset does may reach an index or a hub (verifiers' harnesses would run `uv sync`).
    "UV_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PIP_NO_INDEX": "1",
}


class BridgeFailed(RuntimeError):
    """The bridge process died, hung or answered garbage (not the package's fault alone)."""


def verifiers_python(environ=None) -> Path:
    """Return the verifiers environment's Python (``LAB_ENGINE_VERIFIERS_PYTHON``, else
    ``<repository>/.venv-verifiers/bin/python``)."""
    value = (environment() if environ is None else environ).get(PYTHON_VARIABLE)
    return Path(value) if value else DEFAULT_PYTHON


def bridge_environment(environ=None, *, home: Path | None = None) -> dict[str, str]:
    """Return the bridge's whole environment: a few process basics of ``environ`` (locale, home,
    temp dir, CA bundle) and the offline switches; never a LAB_* variable or a job secret.

    ``home``, when given, is the bridge's ``HOME``: verifiers keeps its cache there
    (``~/.cache/verifiers``: prepared chat programs, rollout working directories, rate-limit
    locks), so the engine gives it a directory of the attempt's work dir, private to the job and
    writable in a pod whose own home is not."""
    source = environment() if environ is None else environ
    env = {name: source[name] for name in _BRIDGE_ENV_NAMES if name in source}
    env.update({name: value for name, value in source.items() if name.startswith("LC_")})
    env.update(_BRIDGE_ENV_FIXED)
    env.setdefault("PATH", os.defpath)
    if home is not None:
        env["HOME"] = str(home)
    return env


class Bridge:
    """One bridge process and its JSON-lines channel; requests are serialised by a lock (the
    trainer may sample in a background thread while it evaluates). ``secrets`` join the bridge's
    environment (``bridge_environment``): the job secrets its environment reads, nothing else.
    ``cwd`` is its working directory (default ``workdir``): where ``load_dataset("owner/name")``
    finds the organization's pushed datasets (``engine.dataset_snapshots``); ``hf_home`` its
    ``HF_HOME`` (default: under its ``HOME``), where ``datasets`` finds the ones its build fetched."""

    def __init__(self, *, python: Path, site: Path, workdir: Path, package_id: str, script: Path = BRIDGE_SCRIPT,
                 secrets: dict[str, str] | None = None, cwd: Path | None = None, hf_home: Path | None = None):
        self.package_id = package_id
        self.log_path = workdir / "environments" / f"verifiers-bridge-{len(_BRIDGES) + 1}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        home = workdir / "environments" / "home"
        home.mkdir(exist_ok=True)
        self._lock = threading.Lock()
        self._buffer = b""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(python), "-I", str(script), "--site", str(site)],
                cwd=cwd or workdir, env={**bridge_environment(home=home), **({"HF_HOME": str(hf_home)} if hf_home else {}), **(secrets or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                start_new_session=True,
            )
        _BRIDGES.append(self)
        self.hello = self._read(START_TIMEOUT_S)

    def _read(self, timeout: float) -> dict:
        """Read one answer line; raise BridgeFailed past ``timeout`` seconds or when the bridge ends."""
        deadline = time.monotonic() + timeout
        stdout = self.process.stdout
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close()
                    raise BridgeFailed(f"the verifiers bridge of {self.package_id} gave no answer in {timeout:.0f} s{self._log_tail()}")
                if not selector.select(left):
                    continue
                chunk = os.read(stdout.fileno(), 1 << 20)
                if not chunk:
                    code = self.process.wait()
                    raise BridgeFailed(f"the verifiers bridge of {self.package_id} exited with status {code}{self._log_tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError:
            raise BridgeFailed(f"the verifiers bridge of {self.package_id} wrote a line that is not JSON: {line[:200]!r}") from None
        if not answer.get("ok"):
            raise BridgeRefused(answer.get("error") or {})
        return answer["result"]

    def _log_tail(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return f": {' | '.join(lines[-3:])[:500]}" if lines else ""

    def request(self, op: str, timeout: float = REQUEST_TIMEOUT_S, **arguments) -> dict:
        """Send one request and return its result; raise BridgeRefused for an error answer and
        BridgeFailed when the process is gone or silent."""
        with self._lock:
            if self.process.poll() is not None:
                raise BridgeFailed(f"the verifiers bridge of {self.package_id} is not running (status {self.process.returncode})")
            try:
                self.process.stdin.write((json.dumps({"op": op, **arguments}) + "\n").encode())
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise BridgeFailed(f"the verifiers bridge of {self.package_id} stopped reading{self._log_tail()}") from None
            return self._read(timeout)

    def close(self) -> None:
        """End the bridge: close its stdin, then SIGTERM and SIGKILL its process group; safe twice."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                for sent in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(self.process.pid, sent)
                        self.process.wait(timeout=3)
                        break
                    except ProcessLookupError:
                        break
                    except subprocess.TimeoutExpired:
                        continue
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class BridgeRefused(Exception):
    """An error answer of the bridge: ``error`` is its ``{"code", "message"[, "module"]}``."""

    def __init__(self, error: dict):
        super().__init__(error.get("message") or "the verifiers bridge refused the request")
        self.code = error.get("code", "")
        self.module = error.get("module")


_BRIDGES: list[Bridge] = []


@atexit.register
def close_bridges() -> None:
    """End every bridge this process started."""
    for bridge in list(_BRIDGES):
        bridge.close()


def _environment_error(package_id: str, refusal: BridgeRefused) -> InvalidEnvironment:
    if refusal.code == "missing_module" and refusal.module:
        return InvalidEnvironment(
            f"environment {package_id} needs the module '{refusal.module}', which is not installed in the verifiers "
            "environment (verifiers 0.4.0 and its dependencies, requirements-verifiers.txt; packages install with "
            "--no-deps: every other dependency must already be there)"
        )
    message = str(refusal).removeprefix(f"taskset {package_id}: ")
    return InvalidEnvironment(f"environment {package_id}: {message}")


def start_bridge(*, package_id: str, site: Path, workdir: Path, requires_verifiers: str = "") -> Bridge:
    """Start the bridge for one installed verifiers package and check the verifiers version.

    ``requires_verifiers`` is the package's verifiers specifier (``">=0.4.0"``, ``""`` for any).
    Raises InvalidEnvironment (exit 2 upstream) when the verifiers environment is missing, lacks
    a module, or holds a verifiers the package does not accept.
    """
    python = verifiers_python()
    if not python.exists():
        raise InvalidEnvironment(
            f"environment {package_id} is a verifiers package, and this engine has no verifiers environment: "
            f"{python} does not exist (`make install` creates .venv-verifiers; {PYTHON_VARIABLE} names another)"
        )
    try:
        bridge = Bridge(python=python, site=site, workdir=workdir, package_id=package_id)
    except BridgeRefused as refusal:
        raise _environment_error(package_id, refusal) from None
    except (BridgeFailed, OSError) as error:
        raise InvalidEnvironment(f"environment {package_id}: cannot start the verifiers bridge: {error}") from None
    installed = bridge.hello.get("verifiers_version", "")
    if requires_verifiers:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            accepted = SpecifierSet(requires_verifiers).contains(installed, prereleases=True)
        except InvalidSpecifier:
            accepted = False
        if not accepted:
            bridge.close()
            raise InvalidEnvironment(
                f"environment {package_id} needs verifiers{requires_verifiers}; this engine runs verifiers {installed}"
            )
    return bridge


def start_load_environment_bridge(
    *, package_id: str, python: Path, site: Path, workdir: Path, secret_names: list[str] | tuple[str, ...] = (), environ=None,
    cwd: Path | None = None, hf_home: Path | None = None,
) -> Bridge:
    """Start the ``load_environment`` bridge (``load_environment_bridge.py``) of one package with
    ``python``, its build's environment's, giving it the job secrets ``secret_names`` from
    ``environ`` (default the engine's environment), the ones its environment reads (the launch's
    ``build.secrets``), in ``cwd``, with ``hf_home`` (the Hugging Face datasets its build fetched,
    ``engine.dataset_snapshots.unpack_hub_datasets``) as its ``HF_HOME`` (``Bridge``). Raises InvalidEnvironment when one is not set, or names one of Lab's own
    variables (``LAB_*``) or one the bridge's environment fixes, and when the bridge cannot start
    (the build lacks verifiers' v0 API, or the process dies)."""
    source = environment() if environ is None else environ
    refused = [name for name in secret_names if name.startswith("LAB_") or name in _BRIDGE_ENV_FIXED or name in _BRIDGE_ENV_NAMES]
    if refused:
        raise InvalidEnvironment(f"environment {package_id}: the secret {refused[0]} is one of the engine's own variables, never given to an environment")
    missing = [name for name in secret_names if not source.get(name)]
    if missing:
        raise InvalidEnvironment(
            f"environment {package_id} reads the secret{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which this job "
            f"was not given: pass {'each' if len(missing) > 1 else 'it'} as a job secret (-e {missing[0]}=... or an env file)"
        )
    secrets = {name: source[name] for name in secret_names}
    try:  # Prime's sandbox client, in the environment's own code, reaches Lab's sandboxes of this attempt
        secrets.update(sandboxes.prime_environment())
    except sandboxes.SandboxError as error:
        logger.warning("environment %s: %s", package_id, error)
    try:
        return Bridge(
            python=python, site=site, workdir=workdir, package_id=package_id, script=LOAD_ENVIRONMENT_BRIDGE_SCRIPT, secrets=secrets, cwd=cwd,
            hf_home=hf_home,
        )
    except BridgeRefused as refusal:
        raise InvalidEnvironment(f"environment {package_id}: {refusal}") from None
    except (BridgeFailed, OSError) as error:
        raise InvalidEnvironment(f"environment {package_id}: cannot start the load_environment bridge: {error}") from None


def describe(bridge: Bridge, *, package_id: str, name: str, summary: str = "") -> EnvironmentInfo:
    """Return the catalogue entry of a verifiers package: its taskset's arguments and defaults.

    Raises InvalidEnvironment when its module is missing, needs a module the verifiers
    environment lacks, or exports no Taskset.
    """
    try:
        described = bridge.request("describe", timeout=START_TIMEOUT_S, taskset=package_id)
    except BridgeRefused as refusal:
        raise _environment_error(package_id, refusal) from None
    except BridgeFailed as error:
        raise InvalidEnvironment(str(error)) from None
    return EnvironmentInfo(id=package_id, name=name, description=described["description"] or summary, args=described["args"])


class VerifiersTaskset(Environment):
    """A verifiers v1 taskset of an uploaded package, as an engine Environment.

    Single-turn, or multi-turn when the package exports its own ``vf.Env`` (``multi_turn``
    true): its episodes then run in the bridge (``start_episodes``, ``reply``) and the engine
    answers each turn (engine/multi_turn.py); ``score`` is single-turn only.

    Subclasses made by ``environment_class`` set ``info`` and ``bridge``. ``args`` are the
    taskset's config fields (``describe``); the job's seed orders the train split.
    ``example(index, split)`` is the task at that position of the split (the bridge's docstring
    says which), with ``info`` holding verifiers' task ``id``, ``key`` and ``idx``;
    ``score(completion, example)`` asks the task's own reward functions. ``timeout`` (the
    block's ``[[env]] timeout``) bounds a multi-turn episode (verifiers' episode deadline) and a
    single-turn scoring; a rollout past it comes back timed out (the bridge's docstring).
    """

    bridge: Bridge

    def __init__(self, args: dict, seed: int):
        super().__init__(args, seed)
        try:
            opened = self.bridge.request("open", timeout=START_TIMEOUT_S, taskset=self.info.id, args=self.args)
        except BridgeRefused as refusal:
            raise _environment_error(self.info.id, refusal) from None
        except BridgeFailed as error:
            raise InvalidEnvironment(str(error)) from None
        self.handle = opened["handle"]
        if opened.get("runtime_rewards"):
            self._give_sandboxes(opened["runtime_rewards"])
        self.sizes = opened["sizes"]
        self.multi_turn = bool(opened.get("multi_turn"))
        # One caller's episodes at a time: the bridge answers a round with every pending turn of the taskset.
        self.episode_lock = threading.Lock()
        self.agents = [agent["name"] for agent in opened.get("agents", [])]
        if self.sizes.get("eval"):
            self.eval_size = self.sizes["eval"]  # an eval of num_examples = -1 takes the whole eval split
        self.rubric = tuple(
            RewardFunction(reward["name"], reward["weight"], self._function_score(reward["name"])) for reward in opened["rewards"]
        )
        self._examples: dict[tuple[str, int], Example] = {}

    def _give_sandboxes(self, names: list[str]) -> None:
        """Give the bridge the attempt's sandbox access (``engine.sandboxes.prime_environment``):
        the reward functions ``names`` take a runtime, a box of verifiers' ``prime`` runtime on
        Lab's sandboxes of this attempt. Raises InvalidEnvironment (exit 2, before any rollout)
        when the engine has none (it runs without Lab: ``--offline``, ``lab envs try``) or Lab
        refuses, rather than train without those rewards."""
        needs = f"environment {self.info.id}: {runtime_rewards_phrase(names)}"
        try:
            access = sandboxes.prime_environment()
        except sandboxes.SandboxError as error:
            raise InvalidEnvironment(f"{needs}, and Lab gave this attempt no sandbox access: {error}") from None
        if not access:
            raise InvalidEnvironment(f"{needs}, which an engine without Lab (--offline, lab envs try) does not have: run it as a job on Lab")
        try:
            self.bridge.request("sandboxes", environment=access)
        except BridgeRefused as refusal:
            raise _environment_error(self.info.id, refusal) from None
        except BridgeFailed as error:
            raise InvalidEnvironment(str(error)) from None

    def _function_score(self, name: str):
        return lambda completion, example: self.score(completion, example).functions.get(name, 0.0)

    def example(self, index: int, split: str = "train") -> Example:
        """Return the task at position ``index`` of ``split`` as an Example: its messages, and the
        row's ``answer`` where the environment's dataset has one (shown, not scored: the bridge
        scores with the environment's own row)."""
        key = (split, index)
        if key not in self._examples:
            start = index - index % TASK_CHUNK
            tasks = self._request("tasks", split=split, start=start, n=TASK_CHUNK, seed=self.seed)["tasks"]
            for offset, task in enumerate(tasks):
                info = {"task_id": task["id"], "key": task["key"], "idx": task["idx"]}
                if task.get("name"):
                    info["name"] = task["name"]
                self._examples[(split, start + offset)] = Example(messages=task["messages"], answer=task.get("answer", ""), info=info)
        return self._examples[key]

    def score(self, completion: str, example: Example) -> Scores:
        """Score a completion with the task's reward functions (each function's raw score, and
        verifiers' weighted reward)."""
        scored = self._request("score", task_id=example.info["task_id"], completion=completion, timeout_s=self.timeout)
        if scored.get("timeout"):  # past the [[env]] timeout: verifiers scored nothing
            return Scores(reward=0.0, functions={function.name: 0.0 for function in self.rubric}, timed_out=True,
                          message=f"environment {self.info.id}: {scored['message']}")
        return Scores(reward=scored["reward"], functions=scored["functions"])

    def start_episodes(self, task_ids: list[str], limits: dict[str, int | None] | None = None) -> dict:
        """Start one multi-turn episode per task id (``Example.info["task_id"]``) under the job's
        ``limits``; return the bridge's answer: ``episodes`` (their ids), the first ``requests``
        and any ``finished`` episodes (the bridge's docstring)."""
        return self._request("start", task_ids=task_ids, limits=dict(limits or {}), timeout_s=self.timeout)

    def reply(self, answers: list[dict]) -> dict:
        """Hand the bridge the policy's replies to its pending requests; return the next
        ``requests`` and the ``finished`` episodes."""
        return self._request("reply", answers=answers)

    def _request(self, op: str, **arguments) -> dict:
        # An answer may wait for episodes or a scoring as long as their [[env]] timeout allows.
        try:
            return self.bridge.request(op, timeout=REQUEST_TIMEOUT_S + (self.timeout or 0.0), handle=self.handle, **arguments)
        except BridgeRefused as refusal:  # the taskset's own code raised (retried per [[env]] retries)
            raise EnvironmentFailed(f"environment {self.info.id}: {refusal}") from None


def environment_class(info: EnvironmentInfo, bridge: Bridge) -> type[VerifiersTaskset]:
    """Return the Environment class of one installed verifiers package."""
    return type("VerifiersTaskset", (VerifiersTaskset,), {"info": info, "bridge": bridge, "__module__": __name__})
