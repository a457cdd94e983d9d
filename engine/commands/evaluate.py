"""`python -m engine evaluate`: one attempt of an evaluation job (engine/evaluation.py), reporting
to Lab (or, `--offline`, under its work dir) as `run` does, with the same exit codes: 0 every
sample scored and sent (or spooled for Lab), 2 an invalid spec, model, environment or checkpoint,
3 stopped (SIGTERM or Lab's `action: stop`), 4 out of memory, 1 a crash (Lab runs the attempt
again; the samples already stored are kept once)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from engine import egress
from engine.catalog import ModelNotFound
from engine.commands.attempt import (
    AttemptReport,
    end_attempt_sandboxes,
    init_checkpoint,
    job_model,
    load_config,
    open_attempt_of,
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
from engine.commands.run import oom_error
from engine.config import ConfigError, default_model_dir
from engine.endpoint_sampling import EndpointRefused
from engine.environments import EnvironmentFailed, InvalidEnvironment
from engine.packages import install_packages, packages_from_environment


def evaluate(args: argparse.Namespace, credentials: dict[str, str]) -> int:
    """Run one attempt of an evaluation with the job's `credentials`; return the exit code."""
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    stop_event = threading.Event()

    def request_stop(signum, frame):  # no logging here: its locks could be held by the interrupted code
        stop_event.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    token = credentials.get("LAB_JOB_TOKEN", "")
    bootstrap = "" if args.offline else credentials.get("LAB_JOB_BOOTSTRAP_TOKEN", "")
    if bootstrap:  # a pod on the Kubernetes pool: Lab says which attempt it runs
        opened = open_attempt_of(args, bootstrap)
        if isinstance(opened, int):
            return opened
        token = opened
    if not args.offline and not token:
        print("engine: LAB_JOB_TOKEN is not set (or pass --offline)", file=sys.stderr)
        return EXIT_INVALID
    report = AttemptReport(args, workdir, token)
    use_attempt_sandboxes(args, token, reports_to_lab=not args.offline)

    def finish(code: int, outcome: str, error: dict | None) -> int:
        end_attempt_sandboxes()
        if error is not None:
            report.say(error["message"])
        report.close(code, outcome, error)
        return code

    evaluator = None
    try:
        try:  # the judges the job declares, on the sandbox's loopback (local launcher), as `run` serves them
            egress.serve_forwards(egress.forwards())
        except ValueError as error:
            raise ConfigError(str(error), "invalid_spec") from None
        model_dir = default_model_dir()
        try:
            install_packages(packages_from_environment(), workdir)
        except InvalidEnvironment as error:
            raise ConfigError(str(error), "environment_error") from None
        # Lab wrote this spec from the evaluation (evaluations.specs): its warnings, about
        # training keys, are not the user's (the evaluation's own are given at its submit).
        job_model(model_dir)
        config, _ = load_config(args.spec, model_dir)
        if not config.spec.eval.env:
            raise ConfigError("an evaluation's spec names the environments it scores as [[eval.env]] blocks; this one has none", "invalid_spec")
        init_value = args.init_from or config.spec.init_from or config.spec.eval.adapter
        init_dir = init_checkpoint(init_value, workdir, report.transport) if init_value else None
        # The evaluator brings transformers and peft: imported once the input above is valid.
        from engine.evaluation import Evaluator

        evaluator = Evaluator(config=config, workdir=workdir, reporter=report.reporter, stop_event=stop_event, model_dir=model_dir)
        try:
            evaluator.setup(init_dir)
        except ModelNotFound as error:
            raise ConfigError(str(error), "model_not_found") from None
        except InvalidEnvironment as error:
            raise ConfigError(str(error), "environment_error") from None
        except EndpointRefused as error:
            raise ConfigError(str(error), "invalid_spec") from None
        except ValueError as error:  # the checkpoint does not fit the model
            raise ConfigError(f"cannot evaluate {init_value}: {one_line(error)}", "invalid_spec") from None
        try:
            outcome = evaluator.run()
        except EnvironmentFailed as error:  # an example's environment code failed alone as well
            raise ConfigError(str(error), "environment_error") from None
        except EndpointRefused as error:  # e.g. its key was revoked mid-run
            raise ConfigError(str(error), "invalid_spec") from None
    except ConfigError as error:
        return finish(EXIT_INVALID, "failed", {"code": error.code, "message": one_line(error)})
    except (MemoryError, oom_error()) as error:
        return finish(EXIT_OOM, "failed", {"code": "oom", "message": f"out of memory: {one_line(error)[:500]}"})
    except Exception as error:
        logger.exception("engine crashed")
        return finish(EXIT_CRASHED, "failed", {"code": "internal_error", "message": exception_line(error)})
    finally:
        if evaluator is not None:
            evaluator.close()
    if outcome == "stopped":
        return finish(EXIT_STOPPED, "stopped", None)
    logger.info("evaluated: %d samples reported", evaluator.reported)
    return finish(EXIT_SUCCEEDED, "succeeded", None)
