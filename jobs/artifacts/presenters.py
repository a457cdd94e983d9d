"""The API object of an artifact (docs/api.md): a Checkpoint or an Adapter, one shape."""

from __future__ import annotations

from typing import Any

from jobs.artifacts.kinds import kind_of
from jobs.models import Artifact
from lab.formats import iso


def artifact_to_dict(artifact: Artifact) -> dict[str, Any]:
    """Return the Checkpoint or Adapter object: ``{"id", "object"`` (``checkpoint``, ``adapter``)``,
    "job_id", "step", "attempt", "status", "format", "size_bytes", "sha256", "created_at"}``;
    ``size_bytes`` (bytes) and ``sha256`` (hex) are null until it is ready."""
    return {
        "id": artifact.public_id,
        "object": kind_of(artifact).name,
        "job_id": artifact.job.public_id,
        "step": artifact.step,
        "attempt": artifact.attempt,
        "status": artifact.status,
        "format": artifact.format,
        "size_bytes": artifact.size_bytes,
        "sha256": artifact.sha256 or None,
        "created_at": iso(artifact.created_at),
    }
