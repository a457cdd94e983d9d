"""API shapes of environment builds (docs/api.md "Environments") and pushed datasets."""

from __future__ import annotations

from typing import Any

from environments.models import BuildStatus, DatasetSnapshot, EnvironmentBuild, EnvironmentPackage
from lab.formats import iso


def recorded_args(summary: dict[str, Any]) -> dict[str, Any]:
    """The arguments a build's ``summary`` recorded as ``{name: default}``, required ones left out."""
    return {parameter["name"]: parameter["default"] for parameter in summary.get("parameters") or [] if not parameter.get("required")}


def package_description(package: EnvironmentPackage, build: EnvironmentBuild | None) -> str:
    """The one line that describes a package version (the Environment object's ``description``):
    the description the package gives itself, as its latest ready build found it
    (``lab_environments.EnvironmentInfo.description``, a v1 taskset's docstring, a
    ``load_environment`` module's docstring; what ``lab envs try`` shows), else its wheel's
    ``Summary`` (docs/environments.md)."""
    own = (build.summary or {}).get("description") if build is not None and build.status == BuildStatus.READY else ""
    return own or package.summary


def build_to_dict(build: EnvironmentBuild | None) -> dict[str, Any] | None:
    """Return a package's build as the Environment object's ``build``: ``{"number", "status"
    (queued|running|ready|failed), "error", "index_url", "index_snapshot_at", "python", "api",
    "environment_class", "args" ({name: default}), "parameters", "dataset_size", "hub_datasets"
    ({"sha256", "size_bytes", "files", "repositories"}: the Hub datasets kept beside it, or null), "reward_functions", "secrets", "verifiers_version", "multi_turn" (whether its episodes have
    several turns; null before a build recorded it), "lock" ([{"name", "version", "sha256"}]),
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
        "hub_datasets": summary.get("hub_datasets"),
        "reward_functions": summary.get("reward_functions", []),
        "secrets": summary.get("secrets", []),
        "verifiers_version": summary.get("verifiers_version"),
        "multi_turn": summary.get("multi_turn"),
        "lock": [{"name": entry["name"], "version": entry["version"], "sha256": entry["sha256"]} for entry in build.lock],
        "created_at": iso(build.created_at),
        "started_at": iso(build.started_at),
        "finished_at": iso(build.finished_at),
    }


def dataset_to_dict(snapshot: DatasetSnapshot) -> dict[str, Any]:
    """Return a pushed dataset as the Dataset object: ``{"id": "<owner>/<name>", "object":
    "dataset", "owner", "name", "filename" (what was pushed), "files" ([{"path", "size_bytes"}]),
    "sha256" and "size_bytes" (of the stored tar), "created_at", "updated_at" (its last push)}``."""
    return {
        "id": snapshot.public_id,
        "object": "dataset",
        "owner": snapshot.owner,
        "name": snapshot.name,
        "filename": snapshot.filename,
        "files": snapshot.files,
        "sha256": snapshot.sha256,
        "size_bytes": snapshot.size_bytes,
        "created_at": iso(snapshot.created_at),
        "updated_at": iso(snapshot.updated_at),
    }
