"""JSON shapes of sandboxes and command results (docs/sandboxes.md)."""

from __future__ import annotations

from typing import Any

from lab.formats import iso
from sandboxes.models import Sandbox
from sandboxes.runtime.base import CommandResult


def sandbox_to_dict(sandbox: Sandbox, *, warnings: list[str] | None = None) -> dict[str, Any]:
    """Return the Sandbox object (its environment's values are never shown, only their names)."""
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
        "job_id": None,
        "error": sandbox.error or None,
        "created_at": iso(sandbox.created_at),
        "started_at": iso(sandbox.started_at),
        "stopped_at": iso(sandbox.stopped_at),
    }
    if warnings is not None:
        body["warnings"] = list(warnings)
    return body


def command_result_to_dict(result: CommandResult) -> dict[str, Any]:
    """Return a command's result: output, exit code, duration (ms), whether it timed out or was cut."""
    return {
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
    }
