"""Deliver what an engine left in its spool when it exited (docs/ingest-api.md).

The engine spools every report on disk (``engine.spool``) and sends it in the background; when
Lab was unreachable at the end, the engine exits with reports still unsent. Before the
reconciler applies an attempt's exit, it reads that attempt's spool (where the launcher can
reach it: the local launcher's work dir) and stores the rest exactly as the ingest API would
have: the same pydantic bodies in batches of at most 1,000, the same services (except that what
arrives after the exit never marks a starting job running), so the attempt rule, per-step merge
and log dedupe hold (a record Lab already has counts as a duplicate), and
then moves the spool's cursors on. A checkpoint or adapter still owed is registered (once per
attempt and step), its archive stored from the work dir and verified like any upload.

The spool is written by the engine, so it is untrusted input: a malformed record is refused
like a malformed request, and a checkpoint archive must be a regular file inside the attempt's
work dir (no path or link may make Lab copy another file into storage).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from engine.spool import Spool, attempt_spool_dir
from jobs import storage
from jobs.artifacts.kinds import KINDS, ArtifactKind
from jobs.ingest import schemas, services
from jobs.models import JobAttempt
from jobs.secrets.services import masker
from lab.errors import LabError
from lab.lib import locks
from lab.lib.locks import advisory_lock

logger = logging.getLogger(__name__)

#: Spool stream → (batch body model, the body's list key, ingest service).
_BATCH_STREAMS = {
    "metrics": (schemas.MetricsBatch, "points", services.ingest_metrics),
    "samples": (schemas.SamplesBatch, "samples", services.ingest_samples),
    "logs": (schemas.LogsBatch, "lines", services.ingest_logs),
    "evaluation-samples": (schemas.EvaluationSamplesBatch, "samples", services.ingest_evaluation_samples),
}


@dataclass
class SpoolDelivery:
    """What delivering one attempt's spool did, per stream: records stored and records refused, and
    why each refused batch was (the job's secrets masked)."""

    delivered: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether nothing had to be refused."""
        return not any(self.refused.values())


def deliver_attempt_spool(*, attempt: JobAttempt, workdir: Path) -> SpoolDelivery:
    """Store what ``attempt``'s engine left unsent in its spool under ``workdir``; idempotent.

    Call after the engine exited and before its exit is applied (while the attempt is still the
    job's current one). Each batch goes through the ingest services in its own transaction; a
    batch they refuse (400/409) is counted in ``refused`` and skipped, like the engine skips a
    4xx. Returns what was delivered and refused per stream.
    """
    directory = attempt_spool_dir(workdir, attempt.number)
    if not directory.is_dir():
        return SpoolDelivery()
    # Two reconcilers may both find the attempt exited: one delivers, the other waits and then
    # finds the cursors moved on, so nothing is stored twice or half-way.
    with advisory_lock(locks.SPOOL_DELIVERY, attempt.pk, wait=True):
        return _deliver(attempt=attempt, workdir=workdir, directory=directory)


def _deliver(*, attempt: JobAttempt, workdir: Path, directory: Path) -> SpoolDelivery:
    result = SpoolDelivery()
    for name, (model, key, ingest) in _BATCH_STREAMS.items():
        spool = Spool(directory, name, writable=False)
        while True:
            _, records = spool.pending(schemas.MAX_BATCH)
            if not records:
                break
            try:
                ingest(attempt=attempt, batch=model.model_validate({"attempt": attempt.number, key: records}), live=False)
                result.delivered[name] = result.delivered.get(name, 0) + len(records)
            except (ValidationError, LabError) as error:
                result.refused[name] = result.refused.get(name, 0) + len(records)
                result.problems.append(_problem(attempt, name, error))
            spool.acknowledge(len(records))
    for kind in KINDS:
        name = f"{kind.name}s"
        spool = Spool(directory, name, writable=False)
        while True:
            _, records = spool.pending(1)
            if not records:
                break
            try:
                _deliver_artifact(kind, attempt=attempt, workdir=workdir, record=records[0])
                result.delivered[name] = result.delivered.get(name, 0) + 1
            except (ValidationError, LabError, ValueError) as error:
                result.refused[name] = result.refused.get(name, 0) + 1
                result.problems.append(_problem(attempt, name, error))
            spool.acknowledge(1)
    if result.delivered or result.refused:
        logger.info(
            "delivered an exited attempt's spool",
            extra={"attempt": attempt.pk, "delivered": result.delivered, "refused": result.refused},
        )
    return result


class _SpooledArtifact(BaseModel):
    """A checkpoint or adapter record of the engine's spool (``engine.reporter.Reporter.checkpoint``); its
    values are checked again by the ingest API's own bodies."""

    model_config = ConfigDict(extra="ignore")
    step: int
    format: str
    archive: str
    size_bytes: int
    sha256: str


def _deliver_artifact(kind: ArtifactKind, *, attempt: JobAttempt, workdir: Path, record: dict) -> None:
    """Register, store and verify one spooled checkpoint or adapter (``Reporter.checkpoint``,
    ``Reporter.adapter``); an archive that is gone fails it."""
    spooled = _SpooledArtifact.model_validate(record)
    register = schemas.ArtifactRegister(attempt=attempt.number, step=spooled.step, format=spooled.format)
    artifact, _ = services.artifact_register(kind, attempt=attempt, report=register, live=False)
    if artifact.status != kind.statuses.UPLOADING:
        return  # settled already (the engine completed it before it exited)
    archive = _archive_inside(workdir, spooled.archive)
    if archive is not None:
        storage.put_file(storage.upload_key(artifact.storage_key), archive)
    complete = schemas.ArtifactComplete(size_bytes=spooled.size_bytes, sha256=spooled.sha256)
    services.artifact_complete(kind, attempt=attempt, artifact_id=artifact.public_id, report=complete)


def _archive_inside(workdir: Path, archive: str) -> Path | None:
    """Return the archive's path when it is a regular file inside ``workdir``, else None."""
    root = Path(workdir).resolve()
    path = Path(archive)
    if not path.is_absolute():
        path = root / path
    resolved = path.resolve()
    if not resolved.is_relative_to(root) or not resolved.is_file():
        return None
    return resolved


def _problem(attempt: JobAttempt, stream: str, error: Exception) -> str:
    """Say why a record of ``stream`` was refused, with the job's secrets masked: the reason may
    quote the record (a metric's name), and it goes into a ``job.data_incomplete`` event."""
    return masker(job_id=attempt.job.public_id)(f"{stream}: {_describe(error)}")


def _describe(error: Exception) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        return f"malformed record ({'.'.join(str(part) for part in first['loc'])}: {first['msg']})"
    if isinstance(error, LabError):
        return getattr(error, "message", str(error))
    return str(error)
