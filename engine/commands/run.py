"""`python -m engine run` and `python -m engine trainer`: one attempt of a job, reporting to Lab
(or, `--offline`, under its work dir), with the roles it runs beside its trainer.

This module checks the attempt's input (the spec against the catalogues, its environments and
checkpoints) with nothing heavier than torch, and loads the training environments of an
orchestrator in this process (their bridges start, their datasets load) before any model: the
trainer (engine.commands.train, which brings transformers and peft) is imported only once the
input is valid, so an environment that cannot load fails the attempt (exit 2) without the
model's load (minutes for a large one)."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import torch

from engine import egress
from engine.commands.attempt import (
    AttemptReport,
    end_attempt_sandboxes,
    init_checkpoint,
    job_model,
    load_config,
    on_main_rank,
    open_attempt_of,
    resume_checkpoint,
    use_attempt_sandboxes,
)
from engine.commands.common import (
    EXIT_CRASHED,
    EXIT_INVALID,
    EXIT_OOM,
    EXIT_STOPPED,
    EXIT_SUCCEEDED,
    exception_line,
    logger,
    one_line,
)
from engine.config import PACKAGES_VARIABLE, ConfigError, default_model_dir, set_variable, setting
from engine.distributed import DataParallel
from engine.environments import InvalidEnvironment
from engine.orchestrator import load_training_environments
from engine.packages import install_packages, packages_from_environment
from engine.remote_inference import start_inference_role, stop_process
from engine.roles import RoleFailed, start_orchestrator_role


def run(args: argparse.Namespace, credentials: dict[str, str]) -> int:
    """Run one attempt (`run`, or the trainer role: `trainer`) with the job's `credentials`
    (`_guard_credentials`); return the exit code."""
    workdir = args.workdir.resolve()
    reports_to_lab = not args.offline
    parallel = DataParallel.from_environment()
    # On the Kubernetes pool a pod opens its attempt with the job's bootstrap token (rank 0's to do).
    bootstrap = "" if args.offline else credentials.get("LAB_JOB_BOOTSTRAP_TOKEN", "")
    if not parallel.is_main:
        # Under torchrun rank 0 alone reports to Lab; the other ranks keep what they would
        # report, offline, in a work dir of their own (engine/distributed.py).
        workdir, args.offline = workdir / "ranks" / f"rank-{parallel.rank}", True
    workdir.mkdir(parents=True, exist_ok=True)
    stop_event = threading.Event()

    def request_stop(signum, frame):  # no logging here: its locks could be held by the interrupted code
        stop_event.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    token = credentials.get("LAB_JOB_TOKEN", "")
    if bootstrap:  # a pod on the Kubernetes pool: Lab says which attempt it runs
        opened = open_attempt_of(args, bootstrap) if parallel.is_main else None
        # Under torchrun the other ranks train the attempt rank 0 opened, from the same checkpoint.
        args.attempt, args.resume_from, packages, code = parallel.broadcast((
            args.attempt, args.resume_from, setting(PACKAGES_VARIABLE) or None, opened if isinstance(opened, int) else None,
        ))
        if code is not None:
            return code
        if packages is not None:
            set_variable(PACKAGES_VARIABLE, packages)
        token = opened if parallel.is_main else ""
    if not args.offline and not token:
        print("engine: LAB_JOB_TOKEN is not set (or pass --offline)", file=sys.stderr)
        return EXIT_INVALID
    report = AttemptReport(args, workdir, token)
    roles = _LocalRoles()
    use_attempt_sandboxes(args, token, reports_to_lab=reports_to_lab)

    def finish_attempt(code: int, outcome: str, error: dict | None) -> int:
        end_attempt_sandboxes()
        report.close(code, outcome, error)
        roles.close(code)
        parallel.close()
        return code

    try:
        if parallel.is_main:
            # The judges the job declares, on the sandbox's loopback (local launcher), for every
            # role and environment process of the attempt; their listeners live as long as this process.
            try:
                egress.serve_forwards(egress.forwards())
            except ValueError as error:
                raise ConfigError(str(error), "invalid_spec") from None
        model_dir = default_model_dir()
        try:
            packages = packages_from_environment()
            # The trainer role never imports environment code: its orchestrator role loads the packages.
            elsewhere = roles.mode(args) != "local"
            if not elsewhere:  # before the spec check: the catalogue then knows the job's uploaded environments
                install_packages(packages, workdir)
        except InvalidEnvironment as error:
            raise ConfigError(str(error), "environment_error") from None
        job_model(model_dir)
        config, warnings = load_config(args.spec, model_dir, elsewhere=frozenset(p.id for p in packages) if elsewhere else frozenset())
        for warning in warnings:
            logger.warning("spec: %s", warning)
        config = roles.configure(args, config, workdir, parallel)
        if args.offline:
            logger.info("offline run: metrics, samples, logs and checkpoints go to %s", workdir)
        # An orchestrator in this process loads its environments before the model: an environment
        # that cannot load fails the attempt before the model, a checkpoint or transformers is loaded.
        try:
            environments = None if config.shared_dir else load_training_environments(config.spec)
        except InvalidEnvironment as error:
            raise ConfigError(str(error), "environment_error") from None
        # Rank 0 fetches a checkpoint from Lab; the other ranks (offline) read its copy.
        resume_dir = on_main_rank(
            parallel, lambda: resume_checkpoint(args.resume_from, workdir, report.transport) if args.resume_from else None
        )
        # A resume carries the trained weights on; the init checkpoint only seeds a fresh start.
        init_value = None if resume_dir is not None else (args.init_from or config.spec.init_from)
        init_dir = on_main_rank(parallel, lambda: init_checkpoint(init_value, workdir, report.transport) if init_value else None)

        # The trainer brings transformers and peft: imported once the input above is valid.
        from engine.commands import train

        roles.rollouts = train.rollout_source(config, roles.orchestrator, environments)
        outcome = train.train(
            args, config, rollouts=roles.rollouts, workdir=workdir, report=report, stop_event=stop_event,
            model_dir=model_dir, parallel=parallel, init_value=init_value, init_dir=init_dir, resume_dir=resume_dir,
        )
    except RoleFailed as error:  # the orchestrator role's failure, reported as its exit code says
        message = one_line(error)
        report.say(message)
        code = error.exit_code if error.exit_code in (EXIT_INVALID, EXIT_OOM) else EXIT_CRASHED
        return finish_attempt(code, "failed", {"code": error.code if code != EXIT_CRASHED else "internal_error", "message": message})
    except ConfigError as error:
        message = one_line(error)
        report.say(message)
        return finish_attempt(EXIT_INVALID, "failed", {"code": error.code, "message": message})
    except (MemoryError, oom_error()) as error:
        message = f"out of memory: {one_line(error)[:500]}"
        report.say(message)
        return finish_attempt(EXIT_OOM, "failed", {"code": "oom", "message": message})
    except Exception as error:
        logger.exception("engine crashed")
        return finish_attempt(EXIT_CRASHED, "failed", {"code": "internal_error", "message": exception_line(error)})
    if outcome == "stopped":
        return finish_attempt(EXIT_STOPPED, "stopped", None)
    return finish_attempt(EXIT_SUCCEEDED, "succeeded", None)


class _LocalRoles:
    """The roles an attempt runs beside its trainer: none (`run`, one process), the trainer
    role's orchestrator elsewhere (`trainer`, LAB_ENGINE_SHARED_DIR), or, with
    `LAB_ENGINE_ROLES=process`, an inference and an orchestrator role this run starts."""

    def __init__(self) -> None:
        self.rollouts = None
        self.orchestrator = None
        self.inference = None
        self.temporary: pathlib.Path | None = None

    @staticmethod
    def mode(args: argparse.Namespace) -> str:
        """How this process runs: "trainer" (the trainer role), "process" (`run` starting the
        other roles: LAB_ENGINE_ROLES=process) or "local" (one process). Raises ConfigError for
        another LAB_ENGINE_ROLES."""
        if args.command == "trainer":
            return "trainer"
        mode = setting("LAB_ENGINE_ROLES", "local")
        if mode not in ("local", "process"):
            raise ConfigError(f"LAB_ENGINE_ROLES must be local or process, not {mode!r}", "internal_error")
        return mode

    def configure(self, args: argparse.Namespace, config, workdir: pathlib.Path, parallel):
        """Return `config` with the shared directory of the trainer role, starting the other
        roles first for `LAB_ENGINE_ROLES=process` (under torchrun rank 0 starts them, and the
        other ranks train on the same shared directory). Raises ConfigError for a bad setting."""
        mode = self.mode(args)
        if mode == "trainer":
            shared = setting("LAB_ENGINE_SHARED_DIR")
            if not shared:
                raise ConfigError("the trainer role needs LAB_ENGINE_SHARED_DIR (docs/engine.md)", "internal_error")
            return dataclasses.replace(config, shared_dir=shared)
        if mode == "local":
            return config
        if not parallel.is_main:
            return dataclasses.replace(config, shared_dir=parallel.broadcast(None), inference="")
        shm = pathlib.Path("/dev/shm")
        self.temporary = pathlib.Path(tempfile.mkdtemp(
            prefix=f"lab-engine-{args.job_id}-{args.attempt}-", dir=str(shm) if shm.is_dir() else str(workdir),
        ))
        url = config.inference if config.inference.startswith(("http://", "https://")) else None
        if url is None:
            url, self.inference = start_inference_role(
                config.spec.model, backend=config.rollout_backend, workdir=workdir / "inference",
                max_lora_rank=config.vllm_max_lora_rank,
            )
        self.orchestrator = start_orchestrator_role(
            ["--spec", str(args.spec.resolve()), "--job-id", args.job_id, "--attempt", str(args.attempt),
             "--workdir", str(workdir / "orchestrator"), "--offline"],
            workdir=workdir / "orchestrator", shared_dir=self.temporary, inference_url=url,
        )
        logger.info("roles: inference at %s, orchestrator pid %d, shared directory %s", url, self.orchestrator.pid, self.temporary)
        return dataclasses.replace(config, shared_dir=parallel.broadcast(str(self.temporary)), inference="")

    def close(self, code: int) -> None:
        """Record the trainer's end for its orchestrator, then stop what this run started."""
        # The orchestrator role's batches (engine.trainer_role.SharedDirRollouts) wait for the trainer's end.
        write_exit = getattr(self.rollouts, "write_exit", None)
        if write_exit is not None and self.rollouts.trainer is not None:
            write_exit(code)
        if self.orchestrator is not None:
            try:
                self.orchestrator.wait(timeout=10)  # it exits once it has read the trainer's end
            except subprocess.TimeoutExpired:
                pass
        stop_process(self.orchestrator)
        stop_process(self.inference)
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)


def oom_error() -> type[BaseException]:
    return getattr(torch, "OutOfMemoryError", MemoryError)
