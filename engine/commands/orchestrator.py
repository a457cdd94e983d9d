"""`python -m engine orchestrator`: the orchestrator role of an attempt, sampling and scoring the
trainer role's batches over their shared directory (docs/engine.md "Three roles")."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import sys
import threading
import time

from engine import sandboxes
from engine.commands.attempt import end_attempt_sandboxes, job_model, load_config
from engine.commands.common import EXIT_CRASHED, EXIT_INVALID, EXIT_SUCCEEDED, exit_with_parent, logger, one_line
from engine.config import PACKAGES_VARIABLE, ConfigError, default_model_dir, parent_pid, set_variable, setting
from engine.distill import TeacherRefused
from engine.environments import EnvironmentFailed, InvalidEnvironment
from engine.models import ModelNotFound, load_prompt_side
from engine.orchestrator import Orchestrator, load_training_environments
from engine.packages import install_packages, packages_from_environment
from engine.remote_inference import HttpRolloutBackend
from engine.roles import OrchestratorRole, SessionEnded


def serve_orchestrator(args: argparse.Namespace) -> int:
    """Run the orchestrator role (engine/roles.py) until the trainer's session ends; return the
    exit code: 0, or 2 (invalid spec or environment) / 1 (crash) after recording the failure
    in the session for the trainer to report."""
    shared, url = setting("LAB_ENGINE_SHARED_DIR"), setting("LAB_ENGINE_INFERENCE_URL")
    if not shared or not url:
        print("engine: the orchestrator role needs LAB_ENGINE_SHARED_DIR and LAB_ENGINE_INFERENCE_URL", file=sys.stderr)
        return EXIT_INVALID
    parent = parent_pid()
    if parent:  # started by `python -m engine run`: end with it
        exit_with_parent(parent)

    def orphaned() -> bool:
        return bool(parent) and os.getppid() != parent

    stopping = threading.Event()

    def request_stop(signum, frame):  # the trainer ends the attempt; a stop only ends waiting for it
        stopping.set()  # and no more: an exception raised into whatever runs could leave a lock held

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    root = pathlib.Path(shared)
    if parent:
        threading.Thread(target=end_when_orphaned, args=(parent, root), name="orphan-watch", daemon=True).start()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    role = OrchestratorRole(root, None, stopping=stopping, parent_pid=parent)
    orchestrator = backend = None
    try:
        try:
            session = role.wait_for_session()
            if session is None:  # stopped before the trainer started
                return EXIT_SUCCEEDED
            if isinstance(session.get("environment_packages"), list):  # the trainer's, with fresh download URLs
                set_variable(PACKAGES_VARIABLE, json.dumps(session["environment_packages"], separators=(",", ":")))
            if isinstance(session.get("sandbox_access"), dict):  # the attempt's sandboxes, by its sandbox key
                sandboxes.use(sandboxes.KeySandboxes(session["sandbox_access"]))
            install_packages(packages_from_environment(), workdir)
            model_dir = default_model_dir()
            job_model(model_dir)
            config, _ = load_config(args.spec, model_dir)  # the trainer reports the spec's warnings
            environments = load_training_environments(config.spec)  # before the tokenizer, as `run` does
            side = load_prompt_side(config.spec.model, model_dir)
            backend = HttpRolloutBackend(url, model_id=config.spec.model)
            orchestrator = Orchestrator(
                config, side.tokenizer, side.stop_token_ids, side.context_length, backend=backend, environments=environments,
            )
            orchestrator.setup()
            role.orchestrator = orchestrator
            return role.run()
        except ModelNotFound as error:
            raise ConfigError(str(error), "model_not_found") from None
        except (InvalidEnvironment, EnvironmentFailed) as error:
            raise ConfigError(str(error), "environment_error") from None
        except TeacherRefused as error:
            raise ConfigError(str(error), "invalid_spec") from None
    except ConfigError as error:
        code, exit_code, message = error.code, EXIT_INVALID, one_line(error)
    except SessionEnded:
        code, exit_code, message = "internal_error", EXIT_CRASHED, "the trainer that started this role is gone"
    except Exception as error:
        logger.exception("the orchestrator role crashed")
        code, exit_code, message = "internal_error", EXIT_CRASHED, one_line(repr(error))[:500]
    finally:
        if orchestrator is not None:
            orchestrator.close()
        end_attempt_sandboxes()
        if backend is not None:
            backend.close()
        if orphaned():  # the run that made the directory died: clear up for it, however this role
            shutil.rmtree(root, ignore_errors=True)  # ended (its inference may have gone first)
    print(f"engine: {message}", file=sys.stderr, flush=True)
    if not orphaned():
        role.fail(exit_code=exit_code, code=code, message=message)
    return exit_code


def end_when_orphaned(parent: int, root: pathlib.Path, poll_s: float = 0.2) -> None:
    """End this role within ``poll_s`` seconds of the trainer ``parent`` dying, however it died
    (SIGKILL included) and whatever the role is doing: clear the shared directory the trainer's run
    left (``root``, in /dev/shm) and exit 1 without clean-up code, which could wait forever on a
    peer that died with the trainer. The attempt's sandboxes are deleted by Lab when it closes the
    attempt; the bridges die with this process (``PR_SET_PDEATHSIG``)."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    shutil.rmtree(root, ignore_errors=True)
    os.write(2, b"engine: the trainer that started this role is gone\n")  # no lock another thread may hold
    os._exit(EXIT_CRASHED)
