"""The trainer role's side of the shared directory (engine/roles.py, docs/engine.md "Three
roles"): its batches read from the orchestrator role's files, its policy published there after
each update (`python -m engine trainer`, or `run` with `LAB_ENGINE_ROLES=process`)."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import subprocess
import time
import uuid
from typing import TYPE_CHECKING

from engine import sandboxes
from engine.config import PACKAGES_VARIABLE, setting
from engine.orchestrator import RolloutBatch, held_out_due
from engine.policy import is_lora, join_weight_gather, policy_adapter, policy_weights
from engine.remote_inference import write_weights
from engine.roles import (
    SESSION_FILE,
    RoleFailed,
    batch_from_json,
    batch_path,
    batch_to_json,
    held_out_path,
    poll,
    read_json,
    sampling_version,
    silence_s,
    weights_path,
    write_json,
)

if TYPE_CHECKING:
    from engine.trainer import Trainer

logger = logging.getLogger("engine")


class SharedDirRollouts:
    """The trainer role's batches: read from the orchestrator role's files; the policy after
    each update published for it (engine.trainer.RolloutSource).

    Under torchrun (engine/distributed.py) every rank reads the batches; rank 0 alone owns the
    directory: it starts the session (its id goes to the other ranks), publishes the policy,
    removes a batch once every rank has trained on it (after the update, which sums every
    rank's gradients), reads the eval/val files and ends the session. The other ranks report
    nothing of their own, so they take no held-out metrics and no batches ahead.

    Raises RoleFailed when the orchestrator reports a failure (`failed.json`) or, when this
    process started it, exits without one.
    """

    def __init__(self, shared_dir: str | pathlib.Path, *, process: subprocess.Popen | None = None):
        self.root = pathlib.Path(shared_dir)
        #: The orchestrator role's process when this run started it (its exit ends the attempt).
        self.process = process
        self.reload_seconds = 0.0
        self.collected: set[int] = set()  # the steps whose eval/val metrics were read
        self.trainer: Trainer | None = None

    def prepare(self, trainer: Trainer, base) -> None:
        """Nothing: the inference role loads the base model itself."""

    def before_sharding(self, trainer: Trainer) -> None:
        """Nothing: the policy is published gathered (`publish`)."""

    def setup(self, trainer: Trainer) -> None:
        """Nothing is loaded here: the orchestrator role loads the environments and samples."""
        self.trainer = trainer

    def start(self) -> dict[int, dict[str, float]]:
        """Start the session (rank 0) for the orchestrator role; return the evals it has written."""
        trainer = self.trainer
        config = trainer.config
        self.depth = config.async_depth
        self.max_steps = config.spec.max_steps
        self.owner = trainer.parallel.is_main
        self.started = time.monotonic()
        self.session = uuid.uuid4().hex
        self.dir = self.root / self.session
        if self.owner:
            self._start_session()
        else:
            join_weight_gather(trainer.model)  # rank 0's publish gathers a sharded model's weights
        self.session = trainer.parallel.broadcast(self.session)  # rank 0's
        self.dir = self.root / self.session
        logger.info("rollouts from the orchestrator role over %s (session %s)", self.root, self.session[:8])
        return self._held_out()

    def _start_session(self) -> None:
        """Clear the directory, write the batches sampled ahead and the starting policy, then
        `session.json`: the orchestrator starts on it (rank 0)."""
        trainer = self.trainer
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for old in self.root.iterdir():  # an earlier session's files (the trainer owns the directory)
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
            for name in ("batches", "weights", "held_out"):
                (self.dir / name).mkdir(parents=True)
        except OSError as error:
            raise RoleFailed(f"LAB_ENGINE_SHARED_DIR {self.root} is not a directory this role can write: {error}"[:500],
                             exit_code=2, code="internal_error") from None
        for batch in trainer.pending_batches:  # sampled ahead before the checkpoint this run resumed from
            write_json(batch_path(self.dir, batch.step), batch_to_json(batch))
        self.publish(trainer.start_step - 1)
        write_json(self.root / SESSION_FILE, {
            "session": self.session, "job_id": trainer.reporter.job_id, "attempt": trainer.reporter.attempt,
            "start_step": trainer.start_step, "next_batch_step": trainer.start_step + len(trainer.pending_batches),
            "max_steps": self.max_steps, "async_depth": self.depth,
            # The packages the orchestrator installs (on Kubernetes with the URLs of Lab's attempt answer).
            "environment_packages": json.loads(setting(PACKAGES_VARIABLE) or "[]"),
            # The attempt's sandbox key (its own sandboxes alone, never the job token) for its environments.
            "sandbox_access": sandboxes.access_for_roles(),
        })

    def publish(self, version: int) -> float:
        """Write the policy as `version` for the orchestrator, which has the inference role load
        it; return the seconds it took. A LoRA policy goes as its adapter (a peft directory) when
        `LAB_ENGINE_VLLM_WEIGHTS` resolves to "lora" for this job (`EngineConfig.
        policy_travels_as_adapter`; the inference role was then started with `--max-lora-rank`),
        else as merged weights."""
        started = time.perf_counter()
        model = self.trainer.model
        target = weights_path(self.dir, version)
        partial = target.with_name(target.name + ".partial")
        if self.trainer.config.policy_travels_as_adapter and is_lora(model):
            policy_adapter(model).save(partial)
        else:
            write_weights(policy_weights(model), partial)
        os.replace(partial, target)
        return time.perf_counter() - started

    def _check_orchestrator(self) -> None:
        """Raise RoleFailed when the orchestrator failed, exited, went silent or another trainer
        took the shared directory over."""
        failed = read_json(self.dir / "failed.json")
        if failed is not None:
            exit_code = failed.get("exit_code")
            raise RoleFailed(
                f"the orchestrator role failed: {str(failed.get('message', ''))[:1000]}",
                exit_code=exit_code if exit_code in (1, 2, 4) else 1, code=str(failed.get("code", "internal_error"))[:64],
            )
        if self.process is not None and self.process.poll() is not None:
            raise RoleFailed(f"the orchestrator role exited with code {self.process.returncode}")
        current = read_json(self.root / SESSION_FILE)
        if current is None or current.get("session") != self.session:
            raise RoleFailed(f"another trainer took the shared directory {self.root} over")
        silent = silence_s(self.dir / "alive", since=self.started)
        if silent is not None:
            raise RoleFailed(f"the orchestrator role has not been heard from for {silent:.0f} s")

    def _wait_for(self, path: pathlib.Path) -> dict:
        return poll(lambda: read_json(path), self._check_orchestrator)

    def _batch(self, step: int) -> RolloutBatch:
        path = batch_path(self.dir, step)
        data = self._wait_for(path)
        try:
            batch = batch_from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise RoleFailed(f"the orchestrator role wrote a malformed batch for step {step}: {error!r}"[:500]) from None
        if batch.step != step:
            raise RoleFailed(f"the orchestrator role wrote step {batch.step}'s batch as step {step}'s")
        self.reload_seconds = float(data.get("weight_reload_s", 0.0) or 0.0)
        return batch

    def next_batch(self, step: int) -> tuple[RolloutBatch, float]:
        return self._batch(step), 0.0

    def after_update(self, step: int) -> tuple[dict[int, dict[str, float]], float]:
        if not self.owner:
            join_weight_gather(self.trainer.model)  # rank 0's publish gathers a sharded model's weights
            return {}, 0.0
        # Every rank has trained on this step's batch: its gradients are in the update.
        batch_path(self.dir, step).unlink(missing_ok=True)
        seconds = self.publish(step)
        # The orchestrator has loaded the policy that sampled this step; the one before it is done with.
        oldest_needed = sampling_version(step, start_step=self.trainer.start_step, depth=self.depth)
        shutil.rmtree(weights_path(self.dir, oldest_needed - 1), ignore_errors=True)
        return self._held_out(), seconds

    def pending(self, step: int) -> list[RolloutBatch]:
        """The batches sampled ahead of `step`, for its checkpoint (rank 0, which writes it)."""
        if not self.owner:
            return []
        return [self._batch(s) for s in range(step + 1, min(step + self.depth, self.max_steps) + 1)]

    def settled(self, step: int) -> dict[int, dict[str, float]]:
        """Before `step`'s checkpoint: the eval/val metrics of every policy up to `step`'s not yet
        returned, waiting for `step`'s own when it is due. Once the batches ahead are written
        (`pending`), those of the earlier policies are too (the orchestrator evaluates a policy
        when it loads it, before sampling with it); so a run resumed from this checkpoint owes
        no eval of a policy it does not train again."""
        if not self.owner:
            return {}
        if held_out_due(self.trainer.config.spec, step):
            path = held_out_path(self.dir, step)
            poll(lambda: True if step in self.collected or path.exists() else None, self._check_orchestrator)
        return self._held_out()

    def finish(self, last_step: int) -> dict[int, dict[str, float]]:
        """Tell the orchestrator no update follows `last_step`, wait until it has written every
        eval it owes, and return those not yet reported."""
        if not self.owner:
            return {}
        write_json(self.dir / "final.json", {"last_step": last_step})
        self._wait_for(self.dir / "done.json")
        return self._held_out()

    def _held_out(self) -> dict[int, dict[str, float]]:
        """The eval/val metrics the orchestrator has written since the last look, by step (each
        file is read once, then removed; rank 0's to read)."""
        results = {}
        if not self.owner:
            return results
        for path in sorted((self.dir / "held_out").glob("step-*.json")):
            data = read_json(path) or {}
            try:
                step = int(data["step"])
                results[step] = {str(k): float(v) for k, v in data["metrics"].items()}
            except (KeyError, TypeError, ValueError, AttributeError):
                raise RoleFailed(f"the orchestrator role wrote a malformed eval file {path.name}") from None
            self.collected.add(step)
            path.unlink()
        return results

    def write_exit(self, exit_code: int) -> None:
        """Record that the trainer has reported its end (the orchestrator then exits 0; rank 0)."""
        if self.owner:
            write_json(self.dir / "exit.json", {"exit_code": exit_code})

    def close(self) -> None:
        """Nothing: the trainer's end is recorded by `write_exit`."""

    def release(self) -> None:
        """Nothing: the orchestrator role's process is its starter's to stop."""
