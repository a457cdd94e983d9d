"""Lab sandboxes for the engine's environments: where a code environment runs the model's
programs, never in the engine's own process (docs/sandboxes.md "Sandboxes of a job").

The control plane is Lab's ingest API with the job token: ``POST sandboxes`` creates a sandbox
of the job's organization (within its cap, tagged with the job and the attempt) and answers its
data-plane access, ``DELETE sandboxes/{id}`` deletes it. Commands then go straight to the sandbox
agent with that sandbox's own token (through the launcher's relay when the engine runs in a
sandbox of its own, ``engine.egress``), never through Lab. ``LabSandboxes`` deletes every
sandbox it made when the attempt ends (``close``); Lab deletes any left when it closes the
attempt, so an engine killed with SIGKILL leaves none.

The attempt's entry point installs one provider (``use``); environments reach it with
``current()``, which raises ``SandboxError`` when the engine runs without Lab (``--offline``).

Environments written for Prime's ``prime-sandboxes`` client (a ``load_environment`` package's own
code, in its bridge process) reach Lab's Prime-compatible sandbox API instead: ``prime_environment``
gives them ``PRIME_API_BASE_URL`` (Lab's ``/prime``) and ``PRIME_API_KEY``, the attempt's sandbox
key, which creates sandboxes billed to this job and reaches those alone; in the local launcher's
sandbox, Lab's and the data plane's addresses are served on its loopback (``egress.serve_forwards``),
so the client's own HTTP calls reach them by their URLs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

import httpx
from labsdk._http import HTTPClient
from labsdk.errors import LabError

from engine import egress

logger = logging.getLogger("engine.sandboxes")


class SandboxError(Exception):
    """A sandbox could not be created, reached or used; ``gone`` when the sandbox no longer
    exists (deleted, past its lifetime, or its agent restarted), so a new one may help."""

    def __init__(self, message: str, *, gone: bool = False):
        super().__init__(message)
        self.gone = gone


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome: its exit code (None when it did not finish), output (text, cut at
    the agent's cap when ``truncated``), whether it ran past its timeout or out of memory, and
    its duration in milliseconds."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    oom_killed: bool
    duration_ms: float
    truncated: bool = False


class Sandbox:
    """One running sandbox's data plane: ``id``, the agent's ``url`` and a ``token`` for this
    sandbox alone (docs/sandboxes.md "Data plane")."""

    def __init__(self, sandbox_id: str, url: str, token: str, *, transport: httpx.BaseTransport | None = None):
        self.id = sandbox_id
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(60.0, connect=5.0),
            follow_redirects=False, transport=transport,
        )

    def run(self, command: str | list[str], *, timeout_s: float = 60.0, environment: dict[str, str] | None = None,
            cwd: str = "") -> CommandResult:
        """Run ``command`` (a string runs under ``/bin/sh -c``) in the sandbox and wait for it, at
        most ``timeout_s`` seconds; ``environment`` adds variables. Raises SandboxError (``gone``
        when the sandbox no longer exists)."""
        body = {"command": command, "timeout_s": timeout_s, "cwd": cwd, "env": dict(environment or {})}
        try:
            response = self._client.post(f"/v1/sandboxes/{self.id}/commands", json=body, timeout=timeout_s + 30)
        except httpx.HTTPError as error:
            raise SandboxError(f"sandbox {self.id}: the data plane is not reachable: {error}") from None
        if response.status_code in (401, 404, 409, 410):
            raise SandboxError(f"sandbox {self.id} is gone ({response.status_code})", gone=True)
        if response.status_code >= 400:
            raise SandboxError(f"sandbox {self.id}: the data plane answered {response.status_code}: {response.text[:300]}")
        answer = response.json()
        return CommandResult(
            exit_code=answer.get("exit_code"), stdout=answer.get("stdout", ""), stderr=answer.get("stderr", ""),
            timed_out=bool(answer.get("timed_out")), oom_killed=bool(answer.get("oom_killed")),
            duration_ms=float(answer.get("duration_ms") or 0.0), truncated=bool(answer.get("truncated")),
        )

    def close(self) -> None:
        """Close the data plane's connections (the sandbox itself stays)."""
        self._client.close()


class SandboxProvider(Protocol):
    """What environments create and delete sandboxes with (``current()``)."""

    def create(self, **fields) -> Sandbox:
        """Create and start a sandbox (``fields``: the body of ``POST /sandboxes``: ``image``,
        ``cpu_cores``, ``memory_gb``, ``disk_gb``, ``timeout_s``, ``name``, ...)."""

    def delete(self, sandbox: Sandbox) -> None:
        """Delete ``sandbox`` (idempotent)."""


class _HeldSandboxes:
    """What a provider made and has not deleted yet (thread-safe): ``_hold`` each sandbox it
    creates, ``_release`` each it deletes; ``close`` deletes whatever is left (failures are logged:
    Lab deletes them anyway when it closes the attempt), closes the provider's HTTP client (``_http``,
    which each provider sets) and returns how many were deleted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, Sandbox] = {}
        self.created = 0

    def delete(self, sandbox: Sandbox) -> None:
        raise NotImplementedError

    def _hold(self, sandbox: Sandbox) -> Sandbox:
        with self._lock:
            self._live[sandbox.id] = sandbox
            self.created += 1
        return sandbox

    def _release(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._live.pop(sandbox.id, None)
        sandbox.close()

    def close(self) -> int:
        with self._lock:
            live = list(self._live.values())
        deleted = 0
        for sandbox in live:
            try:
                self.delete(sandbox)
                deleted += 1
            except SandboxError as error:
                logger.warning("%s", error)
        self._http.close()
        return deleted


class LabSandboxes(_HeldSandboxes):
    """Sandboxes of one attempt, created and deleted through Lab's ingest API with the job token.

    Thread-safe; remembers what it created so that ``close`` deletes whatever is left.
    """

    def __init__(self, lab_url: str, job_id: str, token: str, *, timeout: float = 30.0):
        self._transport = egress.transport()
        self._http = HTTPClient(
            base_url=f"{lab_url.rstrip('/')}/api/v1/ingest/jobs/{job_id}", token=token, timeout=timeout,
            max_retries=2, user_agent="lab-engine", transport=self._transport,
        )
        super().__init__()

    def create(self, **fields) -> Sandbox:
        """Create a sandbox for this attempt; return its data plane. Raises SandboxError when Lab
        refuses (the organization's cap, an attempt that has ended) or the runtime failed it."""
        try:
            answer = self._http.request("POST", "sandboxes", json_body=fields) or {}
        except LabError as error:
            raise SandboxError(f"Lab created no sandbox: {error}") from None
        access = answer.get("data_plane")
        if answer.get("status") != "running" or not access:
            raise SandboxError(f"sandbox {answer.get('id')} did not start: {answer.get('error') or answer.get('status')}")
        sandbox = self._hold(Sandbox(answer["id"], access["url"], access["token"], transport=self._transport))
        logger.info("sandbox %s created", sandbox.id)
        return sandbox

    def delete(self, sandbox: Sandbox) -> None:
        """Delete ``sandbox`` through Lab (a sandbox Lab no longer knows counts as deleted)."""
        self._release(sandbox)
        try:
            self._http.request("DELETE", f"sandboxes/{sandbox.id}")
        except LabError as error:
            if error.status_code != 404:
                raise SandboxError(f"Lab did not delete sandbox {sandbox.id}: {error}") from None

    def prime_access(self) -> dict[str, str]:
        """Return what Prime's client needs to reach Lab's sandboxes for this attempt: Lab's
        ``{"api_key", "base_url", "data_plane_url"}`` (``POST sandbox-key``). Raises SandboxError
        when Lab refuses (an attempt that has ended)."""
        try:
            return self._http.request("POST", "sandbox-key", json_body={}) or {}
        except LabError as error:
            raise SandboxError(f"Lab gave no sandbox key: {error}") from None


class KeySandboxes(_HeldSandboxes):
    """Sandboxes of one attempt created and deleted with the attempt's sandbox key through Lab's
    Prime-compatible routes (``access``: ``{"api_key", "base_url", "data_plane_url"}``, what
    ``LabSandboxes.prime_access`` answers): what the orchestrator role, which holds no job token,
    gives its environments. The key reaches this attempt's sandboxes alone. Thread-safe; ``close``
    deletes whatever it made and is left."""

    def __init__(self, access: dict[str, str], *, timeout: float = 30.0):
        self.access = dict(access)
        self._transport = egress.transport()
        self._http = httpx.Client(
            base_url=f"{access['base_url'].rstrip('/')}/api/v1", headers={"Authorization": f"Bearer {access['api_key']}"},
            timeout=timeout, follow_redirects=False, transport=self._transport,
        )
        super().__init__()

    def create(self, **fields) -> Sandbox:
        """Create a sandbox for this attempt (the fields of ``LabSandboxes.create``); return its data
        plane. Raises SandboxError when Lab refuses or the sandbox did not start."""
        if fields.get("network", "none") != "none":
            raise SandboxError("a sandbox with a network is not made with the attempt's sandbox key")
        body = {"name": fields.get("name") or "", "docker_image": fields.get("image", "python:3.11"),
                "cpu_cores": fields.get("cpu_cores", 1.0), "memory_gb": fields.get("memory_gb", 1.0),
                "disk_size_gb": fields.get("disk_gb", 1.0), "timeout_minutes": -(-int(fields.get("timeout_s", 3600)) // 60)}
        try:
            response = self._http.post("sandbox", json=body)
        except httpx.HTTPError as error:
            raise SandboxError(f"Lab created no sandbox: {error}") from None
        if response.status_code != 201:
            raise SandboxError(f"Lab created no sandbox: {response.status_code} {response.text[:300]}")
        answer = response.json()
        access = answer.get("gatewayAuth")
        if answer.get("status") != "RUNNING" or not access:
            raise SandboxError(f"sandbox {answer.get('id')} did not start: {answer.get('errorMessage') or answer.get('status')}")
        sandbox = self._hold(Sandbox(answer["id"], access["gateway_url"], access["token"], transport=self._transport))
        logger.info("sandbox %s created with the attempt's sandbox key", sandbox.id)
        return sandbox

    def delete(self, sandbox: Sandbox) -> None:
        """Delete ``sandbox`` through Lab (one Lab no longer knows counts as deleted)."""
        self._release(sandbox)
        try:
            response = self._http.delete(f"sandbox/{sandbox.id}")
        except httpx.HTTPError as error:
            raise SandboxError(f"Lab did not delete sandbox {sandbox.id}: {error}") from None
        if response.status_code >= 400 and response.status_code != 404:
            raise SandboxError(f"Lab did not delete sandbox {sandbox.id}: {response.status_code}")

    def prime_access(self) -> dict[str, str]:
        """Return the access this provider was given (Prime's client uses the same key)."""
        return dict(self.access)


_provider: SandboxProvider | None = None


def use(provider: SandboxProvider | None) -> None:
    """Make ``provider`` the sandboxes environments get from ``current()`` (None: none)."""
    global _provider
    _provider = provider


def current() -> SandboxProvider:
    """Return the attempt's sandbox provider; SandboxError when the engine runs without Lab."""
    if _provider is None:
        raise SandboxError("this environment runs code in Lab sandboxes, which an engine without Lab (--offline) has not")
    return _provider


_prime: dict[str, str] | None = None


def prime_environment() -> dict[str, str]:
    """Return the variables that point Prime's ``prime-sandboxes`` client at Lab for this attempt
    (``PRIME_API_BASE_URL``, ``PRIME_API_KEY``), once asked of Lab; empty when the engine runs
    without Lab or its provider gives none. In the local launcher's sandbox, Lab's and the data
    plane's origins are first served on the sandbox's loopback through their relays. Raises
    SandboxError when Lab refuses."""
    global _prime
    if _prime is not None:
        return dict(_prime)
    asker = getattr(_provider, "prime_access", None)
    if asker is None:
        return {}
    access = asker()
    # Origins the launcher had served already (a judge on Lab's own address) are not served twice.
    routes, forwarded = egress.routes(), egress.forwards()
    origins = {egress.origin_of(access["base_url"]), egress.origin_of(access["data_plane_url"])}
    try:
        egress.serve_forwards({origin: routes[origin] for origin in origins if origin in routes and origin not in forwarded})
    except ValueError as error:
        raise SandboxError(f"Lab's sandboxes cannot be reached from the engine's sandbox: {error}") from None
    _prime = {"PRIME_API_BASE_URL": access["base_url"], "PRIME_API_KEY": access["api_key"]}
    return dict(_prime)


def close() -> int:
    """Delete the attempt's remaining sandboxes and forget the provider; return how many were
    deleted (0 without one)."""
    global _prime
    provider, _prime = _provider, None
    use(None)
    closer = getattr(provider, "close", None)
    return closer() if closer is not None else 0


def access_for_roles() -> dict[str, str] | None:
    """Return the attempt's sandbox access (``prime_access``) for an orchestrator role that runs
    the environments elsewhere, or None when the engine has no provider or Lab gives none (logged)."""
    asker = getattr(_provider, "prime_access", None)
    if asker is None:
        return None
    try:
        return asker()
    except SandboxError as error:
        logger.warning("the orchestrator role gets no sandboxes: %s", error)
        return None
