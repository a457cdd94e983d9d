"""JSON shapes of sandboxes and command results (docs/sandboxes.md)."""

from __future__ import annotations

from typing import Any

from lab.formats import iso
from sandboxes.logs import SandboxLogs
from sandboxes.models import Sandbox
from sandboxes.services import DataPlaneAccess


def sandbox_to_dict(
    sandbox: Sandbox, *, warnings: list[str] | None = None, access: DataPlaneAccess | None = None
) -> dict[str, Any]:
    """Return the Sandbox object (its environment's values are never shown, only their names);
    the create answer adds ``warnings`` and ``data_plane`` (``access_to_dict``)."""
    body = {
        "id": sandbox.public_id,
        "object": "sandbox",
        "name": sandbox.name,
        "status": sandbox.status,
        "image": sandbox.image,
        "cpu_cores": sandbox.cpu_cores,
        "memory_gb": sandbox.memory_gb,
        "disk_gb": sandbox.disk_gb,
        "timeout_s": sandbox.timeout_s,
        "network": sandbox.network,
        "environment_names": sorted(sandbox.environment),
        "labels": dict(sandbox.labels),
        "job_id": sandbox.attempt.job.public_id if sandbox.attempt_id else None,
        "error": sandbox.error or None,
        "created_at": iso(sandbox.created_at),
        "started_at": iso(sandbox.started_at),
        "stopped_at": iso(sandbox.stopped_at),
    }
    if warnings is not None:
        body["warnings"] = list(warnings)
    if access is not None:
        body["data_plane"] = access_to_dict(access)
    return body


def access_to_dict(access: DataPlaneAccess) -> dict[str, Any]:
    """Return data-plane access: ``{"url", "token", "expires_at"}`` (docs/sandboxes.md "Data plane")."""
    return {"url": access.url, "token": access.token, "expires_at": iso(access.expires_at)}


def bulk_delete_to_dict(deleted: list[str], not_found: list[str]) -> dict[str, Any]:
    """Return the answer of a bulk delete: ``{"object": "sandbox.bulk_delete", "deleted", "not_found"}``."""
    return {"object": "sandbox.bulk_delete", "deleted": list(deleted), "not_found": list(not_found)}


def logs_to_dict(sandbox: Sandbox, logs: SandboxLogs) -> dict[str, Any]:
    """Return a sandbox's log: ``{"object": "sandbox.logs", "sandbox_id", "logs", "truncated"}``."""
    return {"object": "sandbox.logs", "sandbox_id": sandbox.public_id, "logs": logs.logs, "truncated": logs.truncated}
