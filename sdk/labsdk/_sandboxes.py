"""``lab.sandboxes``: isolated places to run untrusted code (docs/sandboxes.md).

A sandbox has its own ``/workspace``, its limits (cores, GB, a lifetime in seconds) and no
network; :meth:`Sandboxes.run` runs a command there and waits for it, :meth:`Sandboxes.upload`
and :meth:`Sandboxes.download` move files in and out. Creating, running and deleting need an API
key with the ``write`` scope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import Field

from labsdk._common import paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.types import LabObject

__all__ = ["CommandResult", "Sandbox", "Sandboxes"]


class Sandbox(LabObject):
    """A sandbox: ``status`` is ``pending``, ``running``, ``stopped`` (deleted or past its
    lifetime) or ``failed``; ``warnings`` only on the answer of :meth:`Sandboxes.create`."""

    id: str
    name: str = ""
    status: str | None = None
    image: str | None = None
    cpu_cores: float | None = None
    memory_gb: float | None = None
    disk_gb: float | None = None
    timeout_s: int | None = None
    network: str | None = None
    environment_names: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    job_id: str | None = None
    error: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    stopped_at: datetime | None = None
    warnings: list[str] = Field(default_factory=list)


class CommandResult(LabObject):
    """What a command did: its output, ``exit_code`` (128 + the signal when killed, 124 past its
    timeout), ``duration_ms``, and whether it ``timed_out`` or its output was ``truncated``."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int
    duration_ms: int | None = None
    timed_out: bool = False
    truncated: bool = False


class Sandboxes:
    """``/sandboxes``: create, list, retrieve and delete sandboxes; run commands and move files.
    Errors are Lab's: 400 ``invalid_request`` naming the field, 404 for a sandbox outside the
    project, 409 ``invalid_state`` for one that is not running, 429 past the organization's cap."""

    def __init__(self, http: HTTPClient):
        self._http = http

    def create(
        self,
        *,
        image: str = "python:3.11",
        name: str = "",
        cpu_cores: float | None = None,
        memory_gb: float | None = None,
        disk_gb: float | None = None,
        timeout_s: int | None = None,
        environment: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Sandbox:
        """Create a sandbox and return it, running (the limits left out take Lab's defaults)."""
        body: dict[str, Any] = {
            "image": image, "name": name, "cpu_cores": cpu_cores, "memory_gb": memory_gb, "disk_gb": disk_gb,
            "timeout_s": timeout_s,
            "environment": dict(environment) if environment is not None else None,
            "labels": dict(labels) if labels is not None else None,
        }
        body = {key: value for key, value in body.items() if value is not None}
        return parse(Sandbox, self._http.request("POST", "sandboxes", json_body=body))

    def list(self, *, labels: Mapping[str, str] | None = None, limit: int = 100) -> list[Sandbox]:
        """Return the project's sandboxes, newest first; those with every label of ``labels`` when given."""
        params: dict[str, Any] = {"limit": limit} | {f"label[{key}]": value for key, value in (labels or {}).items()}
        return [*paginate(self._http, "sandboxes", Sandbox, params)]

    def get(self, sandbox_id: str) -> Sandbox:
        """Return one sandbox."""
        return parse(Sandbox, self._http.request("GET", f"sandboxes/{segment(sandbox_id)}"))

    def delete(self, sandbox_id: str) -> None:
        """Stop a sandbox and delete its files."""
        self._http.request("DELETE", f"sandboxes/{segment(sandbox_id)}")

    def run(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``command`` (a string runs under ``/bin/sh -c``) in the sandbox and wait for it,
        at most ``timeout_s`` seconds (Lab's default 60). The client's own ``timeout`` must be
        longer than the command's."""
        body: dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if cwd is not None:
            body["cwd"] = cwd
        if env is not None:
            body["env"] = dict(env)
        return parse(CommandResult, self._http.request("POST", f"sandboxes/{segment(sandbox_id)}/commands", json_body=body))

    def upload(self, sandbox_id: str, path: str, data: bytes) -> str:
        """Write ``data`` at ``path`` in the sandbox's /workspace; return the absolute path there."""
        response = self._http._send(
            "PUT", f"sandboxes/{segment(sandbox_id)}/files", params={"path": path}, content=bytes(data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return self._http._decode(response)["path"]

    def download(self, sandbox_id: str, path: str) -> bytes:
        """Return the file at ``path`` in the sandbox's /workspace."""
        return self._http._send("GET", f"sandboxes/{segment(sandbox_id)}/files", params={"path": path}).content
