"""``lab.sandboxes``: isolated places to run untrusted code (docs/sandboxes.md).

A sandbox has its own ``/workspace`` and ``/tmp``, its limits (cores, GB, a lifetime in seconds)
and no network. Creating, listing and deleting go to Lab's API; commands and files go straight
to the sandbox agent that holds the sandbox (its data plane), with a short-lived token for that
sandbox alone which the create answer or ``POST /sandboxes/{id}/auth`` gives and this client
keeps until shortly before it expires: :meth:`Sandboxes.run` runs a command and waits for it,
:meth:`Sandboxes.stream` yields its output as it comes, :meth:`Sandboxes.start_background` and
:meth:`Sandboxes.background` run one in the background, :meth:`Sandboxes.upload` and
:meth:`Sandboxes.download` move files. Everything but reading needs an API key with ``write``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx
from pydantic import Field

from labsdk._common import paginate, parse, segment
from labsdk._http import HTTPClient
from labsdk.errors import APIConnectionError, AuthenticationError, ConflictError
from labsdk.types import LabObject

__all__ = [
    "BackgroundCommand", "BulkDeleteResult", "CommandEvent", "CommandResult", "DataPlane", "Sandbox", "SandboxLogs", "Sandboxes",
]

#: A token is fetched anew this many seconds before it expires.
TOKEN_MARGIN_S = 30.0


class DataPlane(LabObject):
    """Where a sandbox's commands and files go: the agent's ``url``, a ``token`` for that sandbox
    alone and when it expires."""

    url: str
    token: str
    expires_at: datetime


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
    data_plane: DataPlane | None = None


class CommandResult(LabObject):
    """What a command did: its output, ``exit_code`` (128 + the signal when killed, 124 past its
    timeout, 137 with ``oom_killed`` when the sandbox's memory ran out), ``duration_ms``, and
    whether it ``timed_out`` or its output was ``truncated``."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int
    duration_ms: int | None = None
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False


class CommandEvent(LabObject):
    """One event of a streamed command: ``type`` is ``started`` (``pid``), ``stdout`` or
    ``stderr`` (``data``, text), then ``exit`` (``exit_code``, ``timed_out``, ``oom_killed``,
    ``truncated``, ``duration_ms``) last."""

    type: str
    data: str = ""
    pid: int | None = None
    exit_code: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    duration_ms: int | None = None


class BackgroundCommand(LabObject):
    """A command started in the background: ``status`` is ``running`` or ``exited`` (then
    ``exit_code`` and its output, each stream's first MiB)."""

    id: str
    status: str
    exit_code: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False


class BulkDeleteResult(LabObject):
    """What :meth:`Sandboxes.bulk_delete` did: the ids ``deleted`` (now stopped) and the ids named
    that the project has not (``not_found``: missing, or another organization's)."""

    deleted: list[str] = Field(default_factory=list)
    not_found: list[str] = Field(default_factory=list)


class SandboxLogs(LabObject):
    """What a sandbox's commands printed, stdout and stderr in the order they came: ``logs`` (the
    last 256 KiB), ``truncated`` when earlier output was dropped."""

    sandbox_id: str
    logs: str = ""
    truncated: bool = False


def _command_body(command: str | Sequence[str], timeout_s: float | None, cwd: str | None, env: Mapping[str, str] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if cwd is not None:
        body["cwd"] = cwd
    if env is not None:
        body["env"] = dict(env)
    return body


class Sandboxes:
    """``/sandboxes``: create, list, retrieve and delete sandboxes (one, or many by ids and labels),
    read what their commands printed; run commands and move files.
    Errors are Lab's: 400 ``invalid_request`` naming the field, 404 for a sandbox outside the
    project, 409 ``invalid_state`` for one that is not running, 429 past the organization's cap."""

    def __init__(self, http: HTTPClient):
        self._http = http
        self._access: dict[str, DataPlane] = {}
        self._data_plane = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=False)

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
        start_command: str | Sequence[str] | None = None,
    ) -> Sandbox:
        """Create a sandbox and return it, running (the limits left out take Lab's defaults).
        ``start_command`` (a string run under ``/bin/sh -c``, or an argv) starts with the sandbox
        and runs as long as it does; it shows as the background command ``bg_start``."""
        body: dict[str, Any] = {
            "image": image, "name": name, "cpu_cores": cpu_cores, "memory_gb": memory_gb, "disk_gb": disk_gb,
            "timeout_s": timeout_s,
            "environment": dict(environment) if environment is not None else None,
            "labels": dict(labels) if labels is not None else None,
            "start_command": start_command if start_command is None or isinstance(start_command, str) else list(start_command),
        }
        body = {key: value for key, value in body.items() if value is not None}
        sandbox = parse(Sandbox, self._http.request("POST", "sandboxes", json_body=body))
        if sandbox.data_plane is not None:
            self._access[sandbox.id] = sandbox.data_plane
        return sandbox

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

    def bulk_delete(self, ids: Sequence[str] = (), *, labels: Mapping[str, str] | None = None) -> BulkDeleteResult:
        """Stop the sandboxes ``ids`` and every active one with all of ``labels`` (at least one of
        the two), deleting their files; return what was deleted and which ids were not found."""
        body: dict[str, Any] = {"ids": list(ids)} | ({"labels": dict(labels)} if labels else {})
        return parse(BulkDeleteResult, self._http.request("POST", "sandboxes/bulk-delete", json_body=body))

    def logs(self, sandbox_id: str) -> SandboxLogs:
        """Return what a sandbox's commands printed: a running one's, or what Lab kept of an ended
        one's (409 ``ConflictError`` when none was kept, saying why). Needs a key with ``write``."""
        return parse(SandboxLogs, self._http.request("GET", f"sandboxes/{segment(sandbox_id)}/logs"))

    def close(self) -> None:
        """Close the connections to sandbox agents."""
        self._data_plane.close()

    def access(self, sandbox_id: str, *, refresh: bool = False) -> DataPlane:
        """Return data-plane access to the sandbox: kept from its create answer or an earlier
        call until ``TOKEN_MARGIN_S`` before it expires, else ``POST /sandboxes/{id}/auth``."""
        kept = self._access.get(sandbox_id)
        if kept is None or refresh or kept.expires_at.timestamp() - TOKEN_MARGIN_S <= time.time():
            kept = parse(DataPlane, self._http.request("POST", f"sandboxes/{segment(sandbox_id)}/auth"))
            self._access[sandbox_id] = kept
        return kept

    def _agent(self, method: str, sandbox_id: str, route: str, *, timeout: float | None = None, stream: bool = False, **kwargs) -> httpx.Response:
        """Send a data-plane request (a new token once when the agent refuses the kept one);
        return the response (open when ``stream``) or raise the SDK's error for its status."""
        for attempt in (0, 1):
            access = self.access(sandbox_id, refresh=attempt == 1)
            request = self._data_plane.build_request(
                method, f"{access.url}/v1/sandboxes/{segment(sandbox_id)}/{route}",
                headers={"Authorization": f"Bearer {access.token}"},
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT, **kwargs,
            )
            try:
                response = self._data_plane.send(request, stream=stream)
            except httpx.HTTPError as exc:
                raise APIConnectionError(f"could not reach the sandbox agent at {access.url}: {exc}") from exc
            if response.status_code < 400:
                return response
            response.read()
            if response.status_code != 401 or attempt == 1:
                self._http._decode(response)
        raise AuthenticationError("the sandbox agent refused a fresh token", code="invalid_token")

    def run(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``command`` (a string runs under ``/bin/sh -c``) in the sandbox and wait for it, at
        most ``timeout_s`` seconds (default 60, cut to the sandbox's remaining lifetime); ``cwd``
        is relative to /workspace or absolute, ``env`` adds variables."""
        body = _command_body(command, timeout_s, cwd, env)
        response = self._agent("POST", sandbox_id, "commands", json=body, timeout=(timeout_s or 60) + 30)
        return parse(CommandResult, response.json())

    def stream(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Iterator[CommandEvent]:
        """Run ``command`` like :meth:`run` and yield its events as they happen, ``exit`` last.
        Closing the iterator early kills the command."""
        body = _command_body(command, timeout_s, cwd, env) | {"stream": True}
        response = self._agent("POST", sandbox_id, "commands", json=body, timeout=(timeout_s or 60) + 30, stream=True)
        try:
            for line in response.iter_lines():
                if line:
                    event = json.loads(line)
                    if event.get("type") == "error":
                        raise ConflictError(event.get("message", "the sandbox ended"), code=event.get("code"))
                    yield parse(CommandEvent, event)
        finally:
            response.close()

    def start_background(
        self,
        sandbox_id: str,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> BackgroundCommand:
        """Start ``command`` in the background and return at once (``timeout_s`` as in :meth:`run`,
        up to 3600); read its status with :meth:`background`."""
        body = _command_body(command, timeout_s, cwd, env)
        return parse(BackgroundCommand, self._agent("POST", sandbox_id, "background", json=body).json())

    def background(self, sandbox_id: str, command_id: str) -> BackgroundCommand:
        """Return a background command's status, exit code and output."""
        return parse(BackgroundCommand, self._agent("GET", sandbox_id, f"background/{segment(command_id)}").json())

    def upload(self, sandbox_id: str, path: str, data: bytes) -> str:
        """Write ``data`` at ``path`` (relative to /workspace, or absolute under /workspace or
        /tmp); return the absolute path there."""
        return self._agent("PUT", sandbox_id, "files", params={"path": path}, content=bytes(data)).json()["path"]

    def download(self, sandbox_id: str, path: str) -> bytes:
        """Return the file at ``path`` (relative to /workspace, or absolute under /workspace or /tmp)."""
        return self._agent("GET", sandbox_id, "files", params={"path": path}).content
