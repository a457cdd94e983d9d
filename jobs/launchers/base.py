"""The launcher interface: ``launch``, ``observe``, ``cancel``, ``cleanup`` (and orphan sweeping).

A launcher knows nothing of job statuses: it starts what it is given, says what it sees, and
signals. The reconciler turns observations into status changes (docs/api.md "Engine exit codes").
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path

from engine.egress import origin_of


class AttemptPhase(StrEnum):
    """What a launcher observes of an attempt."""

    PENDING = "pending"  # accepted, not running yet (image pull, queueing, process starting)
    RUNNING = "running"
    EXITED = "exited"  # ended with an exit code (or killed by a signal: negative code)
    LOST = "lost"  # gone without a trace of how it ended


class LauncherUnavailable(Exception):
    """What the launcher runs on cannot be reached now (a cluster API outage): nothing was
    decided, so the caller leaves its jobs as they are and asks again later."""


@dataclass(frozen=True)
class Observation:
    """What a launcher sees of one attempt now.

    ``reason`` says why in docs/api.md's words when the launcher knows (``kueue_pending``,
    ``image_pull_failed``, ``unschedulable``, ``oom``...). ``started_at`` and ``ended_at`` are
    when the attempt's compute began and ended as the launcher measured them (process or pod
    times, UTC; None while unknown or still running): what usage is billed from, never the
    engine's own word. ``kept_in_queue`` says the attempt ended (a preemption) but what ran it
    waits in the cluster's queue for the job's next attempt (a JobSet Kueue evicted and will
    readmit at its place: ``jobs.readmission``), so the reconciler keeps it instead of cleaning up.
    """

    phase: AttemptPhase
    exit_code: int | None = None
    oom_killed: bool = False
    detail: str = ""
    reason: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    kept_in_queue: bool = False


@dataclass(frozen=True)
class QueuePlaces:
    """Where launched attempts wait in the pool's own queue: ``places`` maps a handle's
    ``(namespace, name)`` to its 1-based place, ``pending`` is how many wait there in all."""

    places: dict[tuple[str, str], int]
    pending: int


@dataclass(frozen=True)
class LaunchRequest:
    """Everything needed to start one attempt of the engine.

    ``token`` is the job token; launchers pass it as ``LAB_JOB_TOKEN`` in the environment,
    never on a command line, and ``secrets`` likewise as variables of their own names. ``resume_archive`` is a checkpoint tar on this machine to resume
    from; with archives in an object store, ``resume_checkpoint_id`` names the checkpoint the
    engine fetches itself through the ingest API instead. ``bootstrap_token`` is this
    launch's bootstrap token (``jobs.ingest.tokens``) for launchers whose engine opens its attempt
    itself (Kubernetes: ``POST /attempts`` at pod start); kept out of the repr like the token.
    """

    job_id: str
    attempt: int
    spec: dict
    lab_url: str
    token: str
    resume_archive: Path | None = None
    resume_checkpoint_id: str | None = None
    organization: str = ""  # slug
    project: str = ""  # slug
    namespace: str = ""  # Kubernetes namespace (LAB_K8S_NAMESPACE, else one per organization)
    priority: str = "normal"  # low | normal | high
    gpu_type: str = "cpu"
    gpus: int = 0
    roles: tuple[str, ...] = ("engine",)  # engine processes to start: the whole engine, unless a launcher splits it
    environments: tuple[str, ...] = ()  # environment ids of the spec
    environment_packages: tuple[dict, ...] = ()  # uploaded packages to install: {"id", "sha256", "url", "filename"}
    #: The job's model when Lab's model store holds it: what ``LAB_JOB_MODEL`` hands the engine
    #: (``jobs.registry.store.stored_model_manifest``); None for a built-in or a placed directory.
    model: dict | None = None
    #: The job's secrets (jobs.secrets.services), for the engine's environment only: launchers never
    #: log them, write them to files or put them on a command line; kept out of the repr.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    bootstrap_token: str = field(default="", repr=False)
    #: The job's kind (``jobs.models.JobKind``): an ``evaluation`` runs ``python -m engine evaluate``
    #: as one engine process, never split into roles (it trains nothing).
    kind: str = "training"


def engine_args(request: LaunchRequest, *, spec_path: str, workdir: str, resume_dir: str | None) -> list[str]:
    """Return the engine's arguments after ``python -m engine`` (docs/local-launcher.md)."""
    args = [
        "evaluate" if request.kind == "evaluation" else "run",
        "--spec", spec_path,
        "--job-id", request.job_id,
        "--attempt", str(request.attempt),
        "--lab-url", request.lab_url,
        "--workdir", workdir,
    ]
    if resume_dir is not None:
        args += ["--resume-from", resume_dir]
    elif request.resume_checkpoint_id is not None:
        args += ["--resume-from", request.resume_checkpoint_id]
    return args


def teacher_url(spec: dict) -> str | None:
    """Return the base URL of the spec's ``[teacher]`` endpoint (stored spec form), or None."""
    teacher = spec.get("teacher") if isinstance(spec, dict) else None
    client = teacher.get("client") if isinstance(teacher, dict) else None
    url = client.get("base_url") if isinstance(client, dict) else None
    return url if isinstance(url, str) and url else None


def eval_endpoint_url(spec: dict) -> str | None:
    """Return the base URL of an evaluation job's ``[eval.endpoint]`` (stored spec form), or None."""
    evaluation = spec.get("eval") if isinstance(spec, dict) else None
    endpoint = evaluation.get("endpoint") if isinstance(evaluation, dict) else None
    url = endpoint.get("base_url") if isinstance(endpoint, dict) else None
    return url if isinstance(url, str) and url else None


def judge_urls(spec: dict) -> list[str]:
    """Return the judge endpoints the spec declares (stored spec form): the ``judge_base_url`` arg
    of each ``[[env]]`` and ``[[eval.env]]`` block with a ``judge``, which Lab set at submit, each
    origin once, in order. A ``judge_base_url`` without a ``judge`` is not declared: the launchers let
    the engine reach the declared ones only (the local sandbox's relays, the pool's NetworkPolicy)."""
    if not isinstance(spec, dict):
        return []
    evaluation = spec.get("eval") if isinstance(spec.get("eval"), dict) else {}
    blocks = [*(spec.get("env") or []), *(evaluation.get("env") or [])]
    urls: dict[str, str] = {}
    for block in blocks:
        if not isinstance(block, dict) or not isinstance(block.get("judge"), dict):
            continue
        url = (block.get("args") or {}).get("judge_base_url")
        if isinstance(url, str) and url:
            urls.setdefault(origin_of(url), url)
    return list(urls.values())


def engine_package_environment(request: LaunchRequest) -> dict[str, str]:
    """Return the variables that hand the engine its uploaded environment packages
    (``LAB_JOB_ENVIRONMENT_PACKAGES``, a JSON list, read by ``engine.packages``) and its stored
    model (``LAB_JOB_MODEL``, read by ``engine.model_store``); none without either. Every launcher
    adds them to the engine's environment."""
    variables = {}
    if request.environment_packages:
        variables["LAB_JOB_ENVIRONMENT_PACKAGES"] = json.dumps(list(request.environment_packages), separators=(",", ":"))
    if request.model is not None:
        variables["LAB_JOB_MODEL"] = json.dumps(request.model, separators=(",", ":"))
    return variables


@dataclass(frozen=True)
class CapturedLine:
    """One line a launcher captured from the engine's stdout or stderr."""

    seq: int
    stream: str
    line: str


class Launcher(abc.ABC):
    """Starts, observes and stops engine attempts. Every method is idempotent."""

    name: str

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> dict:
        """Start the attempt (or find it already started) and return its JSON-able handle."""

    @abc.abstractmethod
    def observe(self, handle: dict) -> Observation:
        """Return what the attempt with ``handle`` is doing now."""

    def observe_many(self, handles: list[dict]) -> list[Observation]:
        """Return what each attempt of ``handles`` is doing now, in order (a cluster launcher
        answers a whole batch from one listing; by default one ``observe`` each)."""
        return [self.observe(handle) for handle in handles]

    @abc.abstractmethod
    def cancel(self, handle: dict, *, force: bool = False) -> None:
        """Ask the attempt to stop (SIGTERM: checkpoint and exit 3), or kill it when ``force``."""

    @abc.abstractmethod
    def cleanup(self, handle: dict) -> None:
        """Free what the attempt held once it ended (processes, pods, secrets, scratch files)."""

    def queue_places(self) -> QueuePlaces | None:
        """Return where launched attempts wait in the pool's own queue (Kueue's, on Kubernetes),
        or None when the pool has none or cannot say (Lab's own estimate stands then)."""
        return None

    def pool_inventory(self) -> list[dict] | None:
        """Return the node groups of the pool this launcher runs on, read from it
        (``[{"gpu_type", "gpus", "count", "product"}]``), or None when it cannot tell (the local
        launcher: ``LAB_POOL`` says). May raise LauncherUnavailable."""
        return None

    def handle_for_readmission(self, handle: dict) -> dict:
        """Return the handle to keep for the job's next attempt when an observation said
        ``kept_in_queue`` (what it must tell apart from the ended attempt). The same by default."""
        return dict(handle)

    def captured_lines(self, handle: dict) -> list[CapturedLine]:
        """Return stdout/stderr lines captured since the last call, noting progress in ``handle``.

        The caller persists ``handle`` afterwards; lines may repeat after a crash between the
        two, so callers store them idempotently by ``seq``. None by default.
        """
        return []

    def engine_workdir(self, handle: dict) -> Path | None:
        """Return the attempt's engine work dir when Lab can read it after the engine exited
        (its spool is delivered from there: ``jobs.ingest.spool``), else None."""
        return None

    def sweep_orphans(self, live_handles: list[dict]) -> list[str]:
        """End engine processes that belong to no live attempt; return what was ended."""
        return []

    def delete_job_files(self, job_id: str, handles: list[dict]) -> None:
        """Delete what this launcher keeps on disk for a deleted job, given its attempts' handles.

        Missing files are not an error. Nothing by default (launchers that keep no files).
        """
