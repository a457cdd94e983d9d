"""API shapes of environment builds (docs/api.md "Environments")."""

from __future__ import annotations

from typing import Any

from environments.models import EnvironmentBuild
from lab.formats import iso


def recorded_args(summary: dict[str, Any]) -> dict[str, Any]:
    """The arguments a build's ``summary`` recorded as ``{name: default}``, required ones left out."""
    return {parameter["name"]: parameter["default"] for parameter in summary.get("parameters") or [] if not parameter.get("required")}


def build_to_dict(build: EnvironmentBuild | None) -> dict[str, Any] | None:
    """Return a package's build as the Environment object's ``build``: ``{"number", "status"
    (queued|running|ready|failed), "error", "index_url", "index_snapshot_at", "python", "api",
    "environment_class", "args" ({name: default}), "parameters", "dataset_size",
    "reward_functions", "secrets", "verifiers_version", "lock" ([{"name", "version", "sha256"}]),
    "created_at", "started_at", "finished_at"}``; None before the first build."""
    if build is None:
        return None
    summary = build.summary or {}
    parameters = summary.get("parameters", [])
    return {
        "number": build.number,
        "status": build.status,
        "error": build.error or None,
        "index_url": build.index_url,
        "index_snapshot_at": iso(build.index_snapshot_at),
        "python": build.python or None,
        "api": summary.get("api"),
        "environment_class": summary.get("environment_class"),
        "args": recorded_args(summary),
        "parameters": parameters,
        "dataset_size": summary.get("dataset_size"),
        "reward_functions": summary.get("reward_functions", []),
        "secrets": summary.get("secrets", []),
        "verifiers_version": summary.get("verifiers_version"),
        "lock": [{"name": entry["name"], "version": entry["version"], "sha256": entry["sha256"]} for entry in build.lock],
        "created_at": iso(build.created_at),
        "started_at": iso(build.started_at),
        "finished_at": iso(build.finished_at),
    }
