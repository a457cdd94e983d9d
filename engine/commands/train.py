"""The training half of `python -m engine run` (and of the trainer role): the trainer of an
attempt whose spec, environments and checkpoints engine.commands.run has already checked.

It brings torch's neighbours (transformers, peft, the policy and its rollout backends), which
take most of the engine's start-up: engine.commands.run imports this module only once the
attempt's input is valid, so that a refused attempt exits without loading them.
"""

from __future__ import annotations

import argparse
import pathlib
import threading
import time

from engine.colocated import InProcessRollouts
from engine.commands.attempt import AttemptReport
from engine.commands.common import logger, one_line
from engine.config import ConfigError, EngineConfig
from engine.distill import TeacherRefused
from engine.distributed import DataParallel
from engine.environments import EnvironmentFailed, InvalidEnvironment
from engine.models import ModelNotFound
from engine.trainer import Trainer
from engine.trainer_role import SharedDirRollouts


def rollout_source(config: EngineConfig, orchestrator, environments: list | None = None) -> InProcessRollouts | SharedDirRollouts:
    """The trainer's rollout source: the orchestrator role's batches over the shared directory
    (the trainer role, and `LAB_ENGINE_ROLES=process`; `orchestrator` the role's process when
    this run started it), else an orchestrator in this process, on `environments` when they
    are loaded already."""
    if config.shared_dir:
        return SharedDirRollouts(config.shared_dir, process=orchestrator)
    return InProcessRollouts(environments)


def train(
    args: argparse.Namespace,
    config: EngineConfig,
    *,
    rollouts: InProcessRollouts | SharedDirRollouts,
    workdir: pathlib.Path,
    report: AttemptReport,
    stop_event: threading.Event,
    model_dir: pathlib.Path,
    parallel: DataParallel,
    init_value: str | None,
    init_dir: pathlib.Path | None,
    resume_dir: pathlib.Path | None,
) -> str:
    """Load the model, start it from `init_dir` (the weights `init_value` names) or resume it
    from `resume_dir`, and train until the last step or a stop; return the trainer's outcome
    ("stopped" after a stop). Raises ConfigError for a model, environment, teacher or checkpoint
    that makes the job invalid."""
    trainer = Trainer(
        config=config, workdir=workdir, reporter=report.reporter, rollouts=rollouts,
        stop_event=stop_event, model_dir=model_dir, parallel=parallel,
    )
    started = time.perf_counter()
    try:
        trainer.setup()
    except ModelNotFound as error:
        raise ConfigError(str(error), "model_not_found") from None
    except InvalidEnvironment as error:
        raise ConfigError(str(error), "environment_error") from None
    except TeacherRefused as error:
        raise ConfigError(str(error), "invalid_spec") from None
    if init_dir is not None:
        try:
            trainer.initialize_from(init_dir)
        except (ValueError, KeyError, FileNotFoundError) as error:
            raise ConfigError(f"cannot start from {init_value}: {one_line(error)}", "invalid_spec") from None
    if resume_dir is not None:
        try:
            trainer.resume(resume_dir)
        except (ValueError, KeyError, FileNotFoundError) as error:
            raise ConfigError(f"cannot resume from {args.resume_from}: {one_line(error)}", "internal_error") from None
    logger.info(
        "loaded %s in %.1fs; training steps %d..%d",
        config.spec.model, time.perf_counter() - started, trainer.start_step, config.spec.max_steps,
    )
    try:
        return trainer.run()
    except TeacherRefused as error:  # e.g. the teacher's key was revoked mid-run
        raise ConfigError(str(error), "invalid_spec") from None
    except EnvironmentFailed as error:  # the environment's own code raised, past its [[env]] retries
        raise ConfigError(str(error), "environment_error") from None
    finally:
        trainer.close()
