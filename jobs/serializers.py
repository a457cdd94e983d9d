"""JSON shapes of jobs, events and catalogue entries (docs/api.md); a checkpoint's or an adapter's is
``jobs.artifacts.presenters``'."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from lab_environments import EnvironmentInfo

from billing.models import Price
from billing.pricing import price_unit
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.serializers import package_description, recorded_args
from jobs.artifacts.presenters import artifact_to_dict
from jobs.models import (
    ACTIVE_STATUSES,
    Checkpoint,
    CheckpointStatus,
    Job,
    JobAttempt,
    JobEvent,
    JobPriority,
    JobStatus,
    Model,
    ModelBuild,
    RolloutSample,
)
from jobs.queue import queue_positions
from jobs.read_once import ReadOnce
from lab.formats import iso, money


def job_to_dict(job: Job) -> dict[str, Any]:
    """Return the Job object: status, queue place, spec, progress, usage and latest checkpoint."""
    return jobs_to_dicts([job])[0]


def jobs_to_dicts(jobs: list[Job]) -> list[dict[str, Any]]:
    """Return the Job objects of ``jobs``, in order, in a constant number of queries: latest ready
    checkpoints (those ``latest_ready_checkpoints_read_once`` holds aside), queue places and
    engine phases are read for all of them at once."""
    jobs = list(jobs)
    held = _LATEST_READY.values()
    latest = {**_latest_ready_checkpoints([job for job in jobs if job.pk not in held]), **held}
    positions = queue_positions(jobs)
    phases = _engine_phases(jobs)
    return [_job_dict(job, latest.get(job.pk), positions.get(job.pk), phases.get(job.pk)) for job in jobs]


def _engine_phases(jobs: list[Job]) -> dict[int, str]:
    """Return the phase of each starting, running or cancelling job's current attempt, as its
    engine's latest heartbeat said (``loading``, ``running``, ``checkpointing``, ``finishing``;
    one query for all of them); jobs whose engine has not reported yet are left out."""
    current = {job.pk: job.attempt for job in jobs if job.status in ACTIVE_STATUSES}
    if not current:
        return {}
    running = {job.pk for job in jobs if job.status == JobStatus.RUNNING}
    attempts = JobAttempt.objects.filter(job_id__in=current).exclude(phase="").values_list("job_id", "number", "phase")
    return {
        job_id: phase
        for job_id, number, phase in attempts
        # A running job is past loading (its engine reported a step); a "loading" heartbeat is
        # one that the step's metrics overtook.
        if current[job_id] == number and not (phase == "loading" and job_id in running)
    }


#: The latest ready checkpoints ``latest_ready_checkpoints_read_once`` read, by job pk (None: none).
_LATEST_READY: ReadOnce[int, Checkpoint | None] = ReadOnce()


@contextmanager
def latest_ready_checkpoints_read_once(jobs: list[Job]) -> Iterator[None]:
    """Read the latest ready checkpoint of each of ``jobs`` in one query, for every Job object of
    theirs made inside the block (which would otherwise read it once per object): for a caller
    that changes many of these jobs in one transaction where none of their checkpoints becomes
    ready or goes (the reconciler finishing a batch of jobs)."""
    latest = _latest_ready_checkpoints(jobs)
    with _LATEST_READY.holding({job.pk: latest.get(job.pk) for job in jobs}):
        yield


def _latest_ready_checkpoints(jobs: list[Job]) -> dict[int, Checkpoint]:
    """Return each job's ready checkpoint of the highest step (one query for all of them), its
    ``job`` the one given."""
    with_checkpoints = {job.pk: job for job in jobs if job.status != JobStatus.QUEUED or job.attempt}
    latest: dict[int, Checkpoint] = {}
    if not with_checkpoints:
        return latest
    ready = Checkpoint.objects.filter(job_id__in=with_checkpoints, status=CheckpointStatus.READY).order_by(
        "job_id", "-step", "-id"
    )
    for checkpoint in ready:  # a job keeps only ``keep_last`` ready ones: a short list
        if checkpoint.job_id not in latest:
            checkpoint.job = with_checkpoints[checkpoint.job_id]
            latest[checkpoint.job_id] = checkpoint
    return latest


def _job_dict(job: Job, latest: Checkpoint | None, position: int | None, phase: str | None) -> dict[str, Any]:
    return {
        "id": job.public_id,
        "object": "job",
        "kind": job.kind,
        "name": job.name,
        "status": job.status,
        "status_reason": job.status_reason or None,
        "queue_position": position,
        "priority": JobPriority(job.priority).label,
        "spec": job.spec,
        "warnings": job.warnings,
        "attempt": job.attempt,
        "step": job.step,
        "max_steps": job.max_steps,
        "phase": phase,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "error": {"code": job.error_code, "message": job.error_message} if job.error_code else None,
        "usage": {
            "gpu_seconds": round(job.gpu_seconds, 3),
            "cpu_seconds": round(job.cpu_seconds, 3),
            "cost_usd": money(job.cost_usd),
        },
        "latest_checkpoint": artifact_to_dict(latest) if latest else None,
        "metadata": job.metadata,
    }


def event_to_dict(event: JobEvent) -> dict[str, Any]:
    """Return the JobEvent object."""
    return {
        "id": event.public_id,
        "object": "event",
        "job_id": event.job.public_id,
        "created_at": iso(event.created_at),
        "level": event.level,
        "type": event.type,
        "message": event.message,
        "data": event.data,
    }


def metric_point_to_dict(step: int, time: datetime, attempt: int, values: dict[str, float]) -> dict[str, Any]:
    """Return one metric point ``{"step","time","attempt","values"}`` (``GET /metrics``, ``metrics`` events)."""
    return {"step": step, "time": iso(time), "attempt": attempt, "values": values}


def sample_to_dict(sample: RolloutSample) -> dict[str, Any]:
    """Return one rollout sample (``GET /samples``, ``sample`` events)."""
    return {
        "step": sample.step,
        "attempt": sample.attempt,
        "group": sample.group,
        "prompt": sample.prompt,
        "completion": sample.completion,
        "reward": sample.reward,
        "advantage": sample.advantage,
        "metrics": sample.metrics,
    }


def log_line_to_dict(seq: int, time: datetime, attempt: int, stream: str, line: str) -> dict[str, Any]:
    """Return one log line ``{"seq","time","attempt","stream","line"}``; ``seq`` is the row id."""
    return {"seq": seq, "time": iso(time), "attempt": attempt, "stream": stream, "line": line}


def model_build_to_dict(build: ModelBuild | None) -> dict[str, Any] | None:
    """Return the check of a pushed model ``{"number","status" (queued|running|ready|failed),
    "error","revision","archive_sha256","archive_size_bytes","created_at","started_at",
    "finished_at"}`` (``error`` and ``revision`` null until it says); None for none."""
    if build is None:
        return None
    return {
        "number": build.number,
        "status": build.status,
        "error": build.error or None,
        "revision": build.revision or None,
        "archive_sha256": build.archive_sha256,
        "archive_size_bytes": build.archive_size_bytes,
        "created_at": iso(build.created_at),
        "started_at": iso(build.started_at) if build.started_at else None,
        "finished_at": iso(build.finished_at) if build.finished_at else None,
    }


def model_to_dict(model: Model, build: ModelBuild | None = None) -> dict[str, Any]:
    """Return a registry model ``{"id","object":"model","status","family","architecture",
    "parameters","active_parameters","context_length","chat_template","tool_call_format","modes",
    "lora_target_modules","memory_gb","revision","size_bytes","licence","description","source",
    "owned_by","build"}``: ``status`` ready|checking|failed (only ready models train);
    ``owned_by`` is the owning organization's slug, null for a model offered to everyone;
    ``memory_gb`` maps each mode to its estimated GPU memory in GB; ``size_bytes`` the bytes Lab
    stores (0 for one it does not); ``build`` the latest check of a pushed model
    (``model_build_to_dict``), else null."""
    return {
        "id": model.id,
        "object": "model",
        "status": model.status,
        "family": model.family,
        "architecture": model.architecture,
        "parameters": model.parameters,
        "active_parameters": model.active_parameters,
        "context_length": model.context_length,
        "chat_template": model.chat_template,
        "tool_call_format": model.tool_call_format or None,
        "modes": model.training_modes,
        "lora_target_modules": model.lora_target_modules,
        "memory_gb": model.memory_gb,
        "revision": model.revision,
        "size_bytes": model.size_bytes,
        "licence": model.licence,
        "description": model.description,
        "source": model.source,
        "owned_by": model.organization.slug if model.organization_id else None,
        "build": model_build_to_dict(build),
    }


def environment_to_dict(environment: EnvironmentInfo) -> dict[str, Any]:
    """Return a built-in environment as an Environment object (``kind`` ``builtin``, no version)."""
    return {
        "id": environment.id,
        "object": "environment",
        "kind": "builtin",
        "name": environment.name,
        "version": None,
        "sha256": None,
        "size_bytes": None,
        "created_at": None,
        "description": environment.description,
        "args": environment.args,
        "entry_point": None,
        "dependencies": [],
        "verifiers_version": None,
        "pushed_by": None,
    }


def environment_package_to_dict(package: EnvironmentPackage, build: EnvironmentBuild | None = None) -> dict[str, Any]:
    """Return an uploaded package as an Environment object (docs/api.md): id
    ``<org>/<name>@<version>``, ``kind`` ``verifiers`` or ``lab``, what its metadata declares, and
    who pushed it (an email, or ``api_key:<key id>``). ``args`` are the arguments its latest
    build ``build`` recorded, ``{name: default}`` (a required one left out), once that build is
    ready; ``{}`` before."""
    pusher = package.pushed_by.email if package.pushed_by else (
        f"api_key:{package.pushed_by_key.public_id}" if package.pushed_by_key_id else None
    )
    return {
        "id": package.public_id,
        "object": "environment",
        "kind": package.kind,
        "name": package.name,
        "version": package.version,
        "sha256": package.sha256,
        "size_bytes": package.size_bytes,
        "created_at": iso(package.created_at),
        "description": package_description(package, build),
        "args": recorded_args(build.summary) if build is not None and build.status == BuildStatus.READY else {},
        "entry_point": package.entry_point,
        "dependencies": package.dependencies,
        "verifiers_version": package.verifiers_version or None,
        "pushed_by": pusher,
    }


def price_to_dict(price: Price) -> dict[str, Any]:
    """Return a price row; ``unit`` says what one hour buys."""
    return {
        "object": "price",
        "resource_type": price.resource_type,
        "usd_per_hour": money(price.usd_per_hour),
        "unit": price_unit(price.resource_type),
        "description": price.description,
    }
