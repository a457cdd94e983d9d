"""Where an attempt starts from: its configuration (the spec checked against the catalogues,
engine.config's settings), the attempt Lab opens for a pod, the checkpoint it resumes or starts
from (a directory, a .tar, or a checkpoint id fetched from Lab), the sandboxes its environments
run code in, and what it reports to Lab."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys

import torch
from labsdk.spec import SpecError, catalog_problems, load_spec_file

from engine import sandboxes
from engine.catalog import EnvironmentInfo, list_environments, list_models
from engine.checkpoint_archives import STATE_DIR, extract_tar
from engine.commands.common import EXIT_CRASHED, EXIT_INVALID, EXIT_STOPPED, logger, one_line
from engine.config import PACKAGES_VARIABLE, ConfigError, engine_config, set_variable, setting
from engine.http_transport import AttemptRefused, HttpTransport, open_attempt
from engine.model_store import MODEL_VARIABLE, StoredModelError, prepare_job_model
from engine.reporter import IngestError, OfflineTransport, Reporter, ReporterLogHandler
from engine.spool import attempt_spool_dir


def load_config(spec_path: pathlib.Path, model_dir: pathlib.Path | None = None, *, elsewhere: frozenset[str] = frozenset()):
    """Read and check the spec against the catalogues; return (EngineConfig, warnings).

    `elsewhere`: ids of uploaded environments another role loads (the trainer role's job's
    packages, which it never imports): they count as installed, with the arguments the spec
    gives them (the orchestrator role checks those when it loads them).
    The engine settings come from the environment (engine.config.engine_config); this sets
    torch's intra-op threads as `LAB_ENGINE_THREADS` says (on CPU by default half the cores, so
    that with overlap the sampler and the trainer each get their own; a shared 2-core machine
    measured several times slower with two threads per op than with one).
    Raises ConfigError with a one-line message for anything that makes the job invalid.
    """
    try:
        parsed = load_spec_file(spec_path)
    except OSError as error:
        raise ConfigError(f"cannot read spec {spec_path}: {error.strerror or error}") from None
    except SpecError as error:
        raise ConfigError(f"invalid spec: {error}") from None
    installed = list_environments()
    declared: dict[str, EnvironmentInfo] = {}
    for env in [*parsed.spec.env, *(parsed.spec.eval.env or [])]:
        if env.id in elsewhere and env.id not in installed:
            info = declared.setdefault(env.id, EnvironmentInfo(env.id, env.id, "loaded by the orchestrator role"))
            info.args.update(getattr(env, "args", None) or {})
    environments = {**installed, **declared}
    problems = catalog_problems(parsed.spec, models=list_models(model_dir), environments=environments)
    if problems:
        first = problems[0]
        code = {"unknown_model": "model_not_found", "unknown_environment": "environment_error"}.get(first.code, "invalid_spec")
        raise ConfigError("; ".join(f"{p.param}: {p.message}" for p in problems), code)
    config, threads = engine_config(parsed.spec)
    if threads <= 0 and not torch.cuda.is_available():
        threads = max(1, (os.cpu_count() or 2) // 2)
    if threads > 0:
        torch.set_num_threads(threads)
    return config, parsed.warnings


def job_model(model_dir: pathlib.Path | None = None) -> pathlib.Path | None:
    """Fetch the job's stored model (`LAB_JOB_MODEL`) into the model cache and add it to the
    catalogue, before the spec is checked against it (engine.model_store); return its directory,
    None for a model Lab does not store. Raises ConfigError `model_not_found` when its files are
    not those Lab recorded, and StoredModelError when storage cannot be reached (a crash: Lab
    tries the attempt again)."""
    try:
        return prepare_job_model(model_dir)
    except StoredModelError as error:
        if error.retryable:
            raise
        raise ConfigError(str(error), "model_not_found") from None


def on_main_rank(parallel, produce):
    """Return `produce()` as rank 0 computed it, on every rank (every rank must call it; under
    torchrun the ranks share one node's file system, so a path rank 0 returns is every rank's).
    Raises the ConfigError rank 0's `produce` raised, on every rank."""
    if parallel.world_size == 1:
        return produce()
    result, refusal = None, None
    if parallel.is_main:
        try:
            result = produce()
        except ConfigError as error:
            refusal = (str(error), error.code)
    result, refusal = parallel.broadcast((result, refusal))
    if refusal is not None:
        raise ConfigError(*refusal)
    return result


def resume_checkpoint(value: str, workdir: pathlib.Path, transport) -> pathlib.Path:
    """Return the directory of the checkpoint to resume from: a local directory or .tar, or a
    checkpoint id (ckpt_...) of this job fetched from Lab (archives in an object store)."""
    if value.startswith("ckpt_"):
        return fetch_checkpoint(value, workdir / "resume", transport, "--resume-from", "internal_error")
    path = pathlib.Path(value)
    if path.is_dir():
        if not (path / STATE_DIR / "state.json").is_file():
            raise ConfigError(f"--resume-from {path} is not a checkpoint (no {STATE_DIR}/state.json)", "internal_error")
        return path
    if path.is_file():
        target = workdir / "resume" / path.stem
        return extract_tar(path, target)
    raise ConfigError(f"--resume-from {path} does not exist", "internal_error")


def fetch_checkpoint(checkpoint_id: str, root: pathlib.Path, transport, what: str, code: str) -> pathlib.Path:
    """Download a checkpoint's archive from Lab with the job token, unpack it under `root`,
    and return the directory. A refusal (not found, not ready) is a ConfigError with `code`;
    Lab or storage being away is an IngestError (a crash, so Lab tries the attempt again).
    An adapter's id (`adp_...`, an evaluation job's `[eval] adapter`) is fetched the same way."""
    archive = root / f"{checkpoint_id}.tar"
    archive.parent.mkdir(parents=True, exist_ok=True)
    adapter = checkpoint_id.startswith("adp_")
    download = getattr(transport, "download_adapter", None) if adapter else transport.download_checkpoint
    if download is None:  # the offline transport: nothing to fetch from
        raise ConfigError(f"{what} {checkpoint_id}: an offline run cannot fetch an adapter from Lab", code)
    try:
        download(checkpoint_id, archive)
    except IngestError as error:
        if error.retryable:
            raise
        raise ConfigError(f"{what} {checkpoint_id}: cannot fetch it: {one_line(error)}", code) from None
    try:
        return extract_tar(archive, root / checkpoint_id)
    finally:
        archive.unlink(missing_ok=True)


def init_checkpoint(value: str, workdir: pathlib.Path, transport) -> pathlib.Path:
    """Return the directory of the checkpoint to initialise from: a local one, or one fetched
    from Lab by id through the ingest API (the job token allows the job's ``init_from``, and an
    evaluation job's ``[eval] adapter``)."""
    if value.startswith(("ckpt_", "adp_")):  # an adapter: an evaluation job's `[eval] adapter`
        what = "init_from" if value.startswith("ckpt_") else "eval.adapter"
        return fetch_checkpoint(value, workdir / "init", transport, what, "invalid_spec")
    path = pathlib.Path(value)
    if path.is_dir():
        if not (path / STATE_DIR / "state.json").is_file():
            raise ConfigError(f"--init-from {path} is not a checkpoint (no {STATE_DIR}/state.json)", "invalid_spec")
        return path
    if path.is_file():
        return extract_tar(path, workdir / "init" / path.stem)
    raise ConfigError(f"--init-from {path} does not exist", "invalid_spec")


def open_attempt_of(args: argparse.Namespace, bootstrap: str) -> str | int:
    """Open the attempt this pod runs with the job's bootstrap token (docs/ingest-api.md "Opening
    an attempt"): set `args.attempt`, `args.resume_from` and the environment packages
    (`LAB_JOB_ENVIRONMENT_PACKAGES`, whose URLs Lab made afresh) from Lab's answer and return the
    attempt's job token; or return the exit code when there is none to run (2 without
    `LAB_POD_UID`/`LAB_JOBSET_NAME`; 3 when Lab refuses: the job ended; 1 when Lab stays away)."""
    pod_uid, jobset = setting("LAB_POD_UID"), setting("LAB_JOBSET_NAME")
    if not pod_uid or not jobset:
        print("engine: LAB_JOB_BOOTSTRAP_TOKEN needs LAB_POD_UID and LAB_JOBSET_NAME", file=sys.stderr)
        return EXIT_INVALID
    try:
        grant = open_attempt(args.lab_url, args.job_id, bootstrap, pod_uid=pod_uid, jobset=jobset)
    except AttemptRefused as error:
        print(f"engine: {one_line(error)}", file=sys.stderr)
        return EXIT_STOPPED
    except IngestError as error:
        print(f"engine: cannot open an attempt: {one_line(error)}", file=sys.stderr)
        return EXIT_CRASHED
    args.attempt, args.resume_from = grant.attempt, grant.resume_from
    if grant.environment_packages is not None:  # download URLs made now, not at launch
        set_variable(PACKAGES_VARIABLE, json.dumps(grant.environment_packages, separators=(",", ":")))
    if grant.model is not None:  # the stored model's URLs, made now too
        set_variable(MODEL_VARIABLE, json.dumps(grant.model, separators=(",", ":")))
    print(f"engine: attempt {grant.attempt}" + (f", resuming from {grant.resume_from}" if grant.resume_from else ""),
          file=sys.stderr, flush=True)
    return grant.token


def use_attempt_sandboxes(args: argparse.Namespace, token: str, *, reports_to_lab: bool) -> None:
    """Give the attempt's environments (``lab/python-code``, a ``load_environment`` package's
    SandboxEnv) Lab's sandboxes of this attempt, created with the job ``token``, when the
    attempt reports to Lab; offline they have none (engine.sandboxes.current raises)."""
    if reports_to_lab and token:
        sandboxes.use(sandboxes.LabSandboxes(args.lab_url, args.job_id, token))


def end_attempt_sandboxes() -> None:
    """Delete the sandboxes the attempt made, at its end however it ends; a failure is logged,
    never raised, since Lab deletes any left when it closes the attempt."""
    try:
        sandboxes.close()
    except Exception:
        logger.exception("deleting the attempt's sandboxes failed")


class AttemptReport:
    """What one attempt reports: to Lab with the job's ``token``, or (``args.offline``) under
    ``workdir``. Until :meth:`close`, the engine's log records and the environment protocol's
    (``lab_environments``: a split too small, a rollout run again) are the job's log lines."""

    def __init__(self, args: argparse.Namespace, workdir: pathlib.Path, token: str):
        self.offline = args.offline
        self.transport = OfflineTransport(workdir) if args.offline else HttpTransport(args.lab_url, args.job_id, token)
        self.reporter = Reporter(self.transport, job_id=args.job_id, attempt=args.attempt, spool_dir=attempt_spool_dir(workdir, args.attempt))
        self.reporter.start()
        self._handler = ReporterLogHandler(self.reporter)
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._loggers = (logger, logging.getLogger("lab_environments"))
        for job_logger in self._loggers:
            job_logger.addHandler(self._handler)
            # Reporting to Lab, the records go to Lab only: the local launcher stores what the
            # process writes to stdout/stderr as job logs too, and each line would show twice.
            job_logger.propagate = args.offline

    def say(self, message: str) -> None:
        """Log the line that ends the attempt: to the job's logs through the reporter, and to
        stderr offline only (as with the records, the launcher would store it twice)."""
        self.reporter.log(f"engine: {message}", "stderr")
        if self.offline:
            print(f"engine: {message}", file=sys.stderr, flush=True)

    def close(self, code: int, outcome: str, error: dict | None) -> None:
        """Send the attempt's end (``outcome``, ``error``) after everything still queued, waiting
        up to ``LAB_ENGINE_FLUSH_TIMEOUT`` s (10 s at most for an invalid job, which has little to
        flush), and give the log records back to stderr."""
        timeout = float(setting("LAB_ENGINE_FLUSH_TIMEOUT", "60"))
        self.reporter.close(outcome, error, timeout=min(timeout, 10.0) if code == EXIT_INVALID else timeout)
        for job_logger in self._loggers:
            job_logger.removeHandler(self._handler)
            job_logger.propagate = True
