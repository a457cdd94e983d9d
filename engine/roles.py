"""The orchestrator and trainer roles, and the shared directory between them: its files, and the
orchestrator role's side (`OrchestratorRole`); the trainer role's side is engine/trainer_role.py.

    python -m engine trainer ...        # LAB_ENGINE_SHARED_DIR: trains, reports to Lab, checkpoints
    python -m engine orchestrator ...   # LAB_ENGINE_SHARED_DIR + LAB_ENGINE_INFERENCE_URL: rollouts
    LAB_ENGINE_ROLES=process python -m engine run ...   # all three roles as local processes

The trainer role owns the directory `LAB_ENGINE_SHARED_DIR` (docs/engine.md "Three roles"):

    session.json                      {"session", "job_id", "attempt", "start_step", "next_batch_step",
                                       "max_steps", "async_depth", "environment_packages"}  (trainer)
    <session>/weights/policy-<v>/     model.safetensors: the policy after v updates, or   (trainer)
                                      its LoRA adapter (adapter_config.json, adapter_model.safetensors)
    <session>/batches/step-<n>.json   the scored rollouts of step n (RolloutBatch)       (orchestrator)
    <session>/held_out/step-<v>.json  {"step", "metrics"}: eval/val of policy v          (orchestrator)
    <session>/final.json              {"last_step"}: no update after this one            (trainer)
    <session>/done.json               {}: every batch and eval it owes is written        (orchestrator)
    <session>/failed.json             {"exit_code", "code", "message"}                   (orchestrator)
    <session>/exit.json               {"exit_code"}: the trainer has reported its end     (trainer)

Every file is written whole and renamed into place, so a reader never sees half of one.
Batch `n` is sampled by exactly policy `max(start_step - 1, n - 1 - async_depth)`, as in one
process (engine/colocated.py `InProcessRollouts`), so runs are reproducible and a resume exact.
Files are JSON, never pickles: the orchestrator runs the environments' (users') code and the
trainer holds the job's Lab token, so nothing the orchestrator writes can run code in the
trainer. For the same reason the orchestrator is given no Lab token: it calls Lab's sandbox routes
alone, with the attempt's sandbox key from `session.json` (engine/sandboxes.py ``KeySandboxes``).

A session is one start of the trainer: it clears the directory and writes a new
`session.json`; an orchestrator follows the newest session and starts over when it changes
(a Kubernetes JobSet readmitted after preemption reuses its volume). A session that already
has `exit.json` when the orchestrator first sees it is an earlier attempt's and is ignored.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

from engine.config import child_environment
from engine.orchestrator import RolloutBatch
from engine.rollout import Completion

if TYPE_CHECKING:
    pass

logger = logging.getLogger("engine")

SESSION_FILE = "session.json"
#: Seconds between looks at the shared directory while waiting (the first waits are shorter).
POLL_S = 0.2
#: The orchestrator touches `<session>/alive` this often (seconds) while it serves a session...
HEARTBEAT_S = 5.0
#: ...and a trainer that has not seen it touched for this long (seconds; the first time: since
#: the session began, which covers the orchestrator's start-up) ends the attempt as a crash.
SILENCE_S = 120.0
START_SILENCE_S = 900.0


class RoleFailed(Exception):
    """The other role ended the attempt: `exit_code` (DESIGN.md §4), `code` (error code), message."""

    def __init__(self, message: str, *, exit_code: int = 1, code: str = "internal_error"):
        super().__init__(message)
        self.exit_code, self.code = exit_code, code


class SessionChanged(Exception):
    """The trainer started a new session: the orchestrator starts over with it."""


class SessionEnded(Exception):
    """The trainer has ended the session (`exit.json`), however it ended: nothing more is owed."""


# ---- files ----

def write_json(path: pathlib.Path, data: dict) -> None:
    """Write `data` to `path` whole: a temporary file in the same directory, then a rename."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(data, separators=(",", ":")))
    os.replace(partial, path)


def read_json(path: pathlib.Path) -> dict | None:
    """The JSON object at `path`, or None when there is none (yet). Raises RoleFailed for a
    file that is not a JSON object (files are renamed into place whole: it was written so)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (ValueError, OSError) as error:
        raise RoleFailed(f"the shared directory's {path.parent.name}/{path.name} is not readable JSON: {error}"[:500]) from None
    if not isinstance(data, dict):
        raise RoleFailed(f"the shared directory's {path.parent.name}/{path.name} is not a JSON object")
    return data


def batch_to_json(batch: RolloutBatch) -> dict:
    """A RolloutBatch as a JSON object (its fields; completions as objects)."""
    return dataclasses.asdict(batch)


def batch_from_json(data: dict) -> RolloutBatch:
    """The RolloutBatch of a batch file. Raises ValueError (or TypeError/KeyError) for a file
    that is not one: its numbers are converted, never evaluated."""
    completions = [
        Completion(
            token_ids=[int(t) for t in c["token_ids"]], logprobs=[float(x) for x in c["logprobs"]],
            truncated=bool(c["truncated"]), policy_version=int(c["policy_version"]),
            loss_mask=[1 if m else 0 for m in c["loss_mask"]] if c.get("loss_mask") is not None else None,
            timed_out=bool(c.get("timed_out", False)),
        )
        for c in data["completions"]
    ]
    return RolloutBatch(
        step=int(data["step"]), policy_version=int(data["policy_version"]),
        env_indices=[int(i) for i in data["env_indices"]], prompts=[[int(t) for t in p] for p in data["prompts"]],
        completions=completions, texts=[str(t) for t in data["texts"]], rewards=[float(r) for r in data["rewards"]],
        functions=[{str(k): float(v) for k, v in f.items()} for f in data["functions"]],
        generate_seconds=float(data["generate_seconds"]),
        env_names=[str(n) for n in data["env_names"]] if data.get("env_names") is not None else None,
        group_sizes=[int(n) for n in data["group_sizes"]] if data.get("group_sizes") is not None else None,
    )


def batch_path(session_dir: pathlib.Path, step: int) -> pathlib.Path:
    return session_dir / "batches" / f"step-{step:08d}.json"


def weights_path(session_dir: pathlib.Path, version: int) -> pathlib.Path:
    return session_dir / "weights" / f"policy-{version}"


def held_out_path(session_dir: pathlib.Path, version: int) -> pathlib.Path:
    return session_dir / "held_out" / f"step-{version:08d}.json"


def silence_s(alive: pathlib.Path, *, since: float, now: float | None = None) -> float | None:
    """Seconds the orchestrator has been silent when that is too long (SILENCE_S since `alive`
    was last touched, or START_SILENCE_S since `since`, a `time.monotonic()`, when never), else None."""
    try:
        age = time.time() - alive.stat().st_mtime
        return age if age > SILENCE_S else None
    except FileNotFoundError:
        waited = (time.monotonic() if now is None else now) - since
        return waited if waited > START_SILENCE_S else None


def poll(read, check):
    """Return the first value of `read()` that is not None, calling `check()` between looks (it
    raises to give up); the waits grow from 10 ms to POLL_S."""
    delay = 0.01
    while (value := read()) is None:
        check()
        time.sleep(delay)
        delay = min(POLL_S, delay * 2)
    return value


def sampling_version(step: int, *, start_step: int, depth: int) -> int:
    """The policy version (updates seen) that samples `step`'s batch: `depth` steps ahead of
    the trainer at most, never older than the weights the session started with."""
    return max(start_step - 1, step - 1 - depth)


# ---- the orchestrator role ----

class OrchestratorRole:
    """Serves the trainer's sessions in `root` with `orchestrator` (set up, sampling through an
    inference role): batches, held-out evals, then waits for the trainer's end."""

    def __init__(self, root: pathlib.Path, orchestrator, *, stopping=None, parent_pid: int | None = None):
        self.root = root
        self.orchestrator = orchestrator
        self.stopping = stopping  # a threading.Event: SIGTERM while no session is being served
        self.parent_pid = parent_pid  # the trainer that started this role (local runs): it ends with it
        self.ignored: set[str] = set()

    def run(self) -> int:
        """Serve sessions until one ends; return the trainer's exit code (0 when none came)."""
        while True:
            session = self.wait_for_session()
            if session is None:
                return 0
            beating = threading.Event()
            heart = threading.Thread(target=self._heartbeat, args=(self.root / str(session["session"]), beating), daemon=True)
            heart.start()
            try:
                return self._serve(session)
            except SessionChanged:
                logger.info("the trainer started a new session: starting over")
            except SessionEnded:
                return 0
            finally:
                beating.set()
                heart.join()

    @staticmethod
    def _heartbeat(directory: pathlib.Path, done) -> None:
        """Touch `directory/alive` every HEARTBEAT_S seconds until `done` is set, so the trainer
        can tell a slow orchestrator (a long batch or eval) from a dead one."""
        while True:
            try:
                (directory / "alive").touch()
            except OSError:
                pass  # the trainer cleared the directory for a new session
            if done.wait(HEARTBEAT_S):
                return

    def wait_for_session(self, timeout: float | None = None) -> dict | None:
        """The newest session not ignored (not ended when first seen); None after a stop or
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (self.stopping is not None and self.stopping.is_set()):
            session = read_json(self.root / SESSION_FILE)
            if session is not None and session.get("session") not in self.ignored:
                if (self.root / str(session["session"]) / "exit.json").exists():
                    self.ignored.add(session["session"])  # an earlier attempt's, already ended
                else:
                    return session
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)
        return None

    def fail(self, *, exit_code: int, code: str, message: str, wait_s: float = 600.0) -> None:
        """Record the orchestrator's failure in the trainer's current session, for the trainer to
        report as the attempt's error. A failure before the trainer has started its session (a
        bad spec, an environment that does not load) waits up to `wait_s` seconds for it."""
        try:
            session = self.wait_for_session(timeout=wait_s)
            if session is not None:
                write_json(self.root / str(session["session"]) / "failed.json", {"exit_code": exit_code, "code": code, "message": message})
        except (RoleFailed, OSError):  # a directory this role cannot read or write: its exit code says the rest
            pass

    def _check_session(self, session: dict) -> None:
        """Raise SessionChanged for a newer session, SessionEnded once the trainer has ended this one
        (also when it failed before its last update: what was being waited for never comes)."""
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            raise SessionEnded()  # the trainer that started this role is gone, however it went
        current = read_json(self.root / SESSION_FILE)
        if current is None or current.get("session") != session["session"]:
            raise SessionChanged()
        if (self.root / str(session["session"]) / "exit.json").exists():
            raise SessionEnded()

    def _serve(self, session: dict) -> int:
        directory = self.root / str(session["session"])
        start_step, depth, max_steps = int(session["start_step"]), int(session["async_depth"]), int(session["max_steps"])
        orchestrator = self.orchestrator
        backend = orchestrator.backend
        loaded: int | None = None
        held_out_done: set[int] = set()

        def owes_held_out(version: int) -> bool:
            """Evals of this session: the base model's (a fresh start) and those after its updates."""
            return orchestrator.held_out_due(version) and (version >= start_step or (version == 0 and start_step == 1))

        def final_step() -> int | None:
            final = read_json(directory / "final.json")
            return None if final is None else int(final["last_step"])

        def load(version: int) -> bool:
            """Load policy `version` into inference (waiting for it); False when it never comes."""
            nonlocal loaded
            path = weights_path(directory, version)

            def published() -> bool | None:
                if path.is_dir():
                    return True
                final = final_step()
                return False if final is not None and final < version else None  # False: it never will be

            if not poll(published, lambda: self._check_session(session)):
                return False
            started = time.perf_counter()
            backend.load_weights_dir(path, version, restart=loaded is None)  # a new session may start below the loaded one
            self.reload_seconds = time.perf_counter() - started
            loaded = version
            if owes_held_out(version) and version not in held_out_done:
                self._write(session, held_out_path(directory, version), {"step": version, "metrics": orchestrator.held_out(version)})
                held_out_done.add(version)
            return True

        self.reload_seconds = 0.0
        for step in range(int(session["next_batch_step"]), max_steps + 1):
            version = sampling_version(step, start_step=start_step, depth=depth)
            while loaded is None or loaded < version:
                if not load(start_step - 1 if loaded is None else loaded + 1):
                    break
            if loaded is None or loaded < version:
                break  # the trainer stopped: no later batch will be trained
            batch = orchestrator.batch(step, version)
            self._write(session, batch_path(directory, step), {**batch_to_json(batch), "weight_reload_s": self.reload_seconds})
        # The evals due for the policies no batch needed (the last steps'), each as soon as it is
        # published (the trainer waits for one before its checkpoint), up to the trainer's last update.
        for version in range(start_step - 1 if loaded is None else loaded + 1, max_steps + 1):
            if owes_held_out(version) and not load(version):
                break  # the trainer stopped before this update
        poll(final_step, lambda: self._check_session(session))
        self._write(session, directory / "done.json", {})
        # Until the trainer has reported the attempt's end, whatever it was: _check_session raises SessionEnded.
        return poll(lambda: None, lambda: self._check_session(session))

    def _write(self, session: dict, path: pathlib.Path, data: dict) -> None:
        try:
            write_json(path, data)
        except FileNotFoundError:  # the trainer cleared the directory for a new session
            self._check_session(session)
            raise


# ---- all roles on one host ----

def start_orchestrator_role(args_line: list[str], *, workdir: pathlib.Path, shared_dir: pathlib.Path, inference_url: str) -> subprocess.Popen:
    """Start `python -m engine orchestrator ARGS` for a local run, in its own process group,
    ending with this process (LAB_ENGINE_PARENT_PID), its output in `workdir/orchestrator.log`.
    It gets this process's environment, which no longer holds Lab's job tokens (engine.cli._guard_credentials)."""
    workdir.mkdir(parents=True, exist_ok=True)
    environment = child_environment(
        LAB_ENGINE_SHARED_DIR=str(shared_dir), LAB_ENGINE_INFERENCE_URL=inference_url,
        LAB_ENGINE_PARENT_PID=str(os.getpid()),
    )
    environment.pop("LAB_ENGINE_INFERENCE", None)
    with open(workdir / "orchestrator.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "engine", "orchestrator", *args_line], stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=environment,
        )
