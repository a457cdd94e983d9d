"""The agent's ASGI application: the control routes Lab's control plane calls and the data plane
clients call directly (docs/sandboxes.md "Data plane").

| route | token | what |
|---|---|---|
| ``GET /healthz`` | none | ``{"status": "ok", "sandboxes", "warm", "memory_limit": "cgroup"|"rlimit", "disk_limit": "tmpfs"|"file_size", "images": {name: built}}`` |
| ``GET /v1/sandboxes`` | control | ``{"instance", "sandboxes": [id, ...]}``: this run's id and the sandboxes it holds |
| ``PUT /v1/sandboxes/{id}`` | control | start the sandbox (idempotent): body ``SandboxSpec`` fields + ``expires_at`` |
| ``GET /v1/sandboxes/{id}`` | control | ``{"id", "status", "host_uid", "expires_at"}`` |
| ``DELETE /v1/sandboxes/{id}`` | control | stop it and delete its files; 204 |
| ``GET /v1/sandboxes/{id}/logs`` | control | ``{"logs", "truncated"}``: what its commands printed, the last ``LOG_BYTES`` (of one it stopped at its lifetime too, until Lab's ``DELETE`` or ``ENDED_LOG_KEEP_S``) |
| ``POST /v1/sandboxes/{id}/commands`` | sandbox | run a command; JSON result, or NDJSON events with ``"stream": true`` |
| ``POST /v1/sandboxes/{id}/background`` | sandbox | start a command in the background; 201 ``{"id", "status"}`` |
| ``GET /v1/sandboxes/{id}/background/{command id}`` | sandbox | its status, exit code and output |
| ``PUT``/``GET /v1/sandboxes/{id}/files?path=`` | sandbox | write / read a file of /workspace, /tmp or the sandbox's writable root |
| ``/prime/{id}/...`` | sandbox | Prime's gateway (``sandboxes.agent.prime``) |

A token that does not open the sandbox named in the path gets the same 404 as a sandbox this
agent does not hold; a missing, malformed or expired token is a 401.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets
import time
from contextlib import aclosing
from typing import Any

from sandboxes import images
from sandboxes.agent import prime, tokens
from sandboxes.agent.http import AgentError, Request, send_bytes, send_json, send_stream
from sandboxes.agent.sandbox import RunningSandbox, SandboxEnded, SandboxLog, warm_spec, with_slot
from sandboxes.runtime.base import CommandRequest, RuntimeRefusal, SandboxSpec
from sandboxes.runtime.local import LocalHost
from sandboxes.runtime.paths import command_directory

_SANDBOX_ID = r"(?P<sandbox>[A-Za-z0-9_-]{1,64})"
_ROUTES = [
    (re.compile(r"^/v1/sandboxes$"), "held"),
    (re.compile(rf"^/v1/sandboxes/{_SANDBOX_ID}$"), "sandbox"),
    (re.compile(rf"^/v1/sandboxes/{_SANDBOX_ID}/commands$"), "commands"),
    (re.compile(rf"^/v1/sandboxes/{_SANDBOX_ID}/background$"), "background"),
    (re.compile(rf"^/v1/sandboxes/{_SANDBOX_ID}/background/(?P<command>bg_[a-z0-9]{{1,32}})$"), "background_command"),
    (re.compile(rf"^/v1/sandboxes/{_SANDBOX_ID}/files$"), "files"),
    (re.compile(rf"^/v1/sandboxes/{_SANDBOX_ID}/logs$"), "logs"),
    (re.compile(rf"^/prime/{_SANDBOX_ID}(?P<rest>/.*)$"), "prime"),
]
#: Bounds of a command's timeout (seconds) and of an uploaded file (bytes).
COMMAND_TIMEOUT_S = (1, 3600, 60)
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
#: How long the log of a sandbox the agent stopped at its lifetime is kept for Lab to take
#: (seconds): Lab's reaper, every 30 s, reads it before its ``DELETE``, which drops it.
ENDED_LOG_KEEP_S = 600.0
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
#: The one user a sandbox has (uid 1000 inside): the only name ``user`` may take.
SANDBOX_USER = "sandbox"


class Agent:
    """The sandboxes this agent holds on ``host``, reached with tokens signed by ``secret``.

    Each sandbox gets a slot of the agent's (its host uid, ``LocalHost.host_uid``), free again
    once it stops. ``warm`` sandboxes without a network are kept started ahead, up to the largest
    limits (``warm_memory_gb``, ``warm_disk_gb``): a create of such a sandbox claims one (its
    folder renamed, its limits lowered) instead of waiting for bwrap and the supervisor, and a new
    one is started behind it.
    """

    def __init__(
        self, host: LocalHost, *, secret: bytes, max_output_bytes: int = 1024 * 1024, warm: int = 0,
        warm_memory_gb: float = 16.0, warm_disk_gb: float = 20.0,
    ) -> None:
        self.host = host
        self.secret = secret
        self.max_output_bytes = max_output_bytes
        self.sandboxes: dict[str, RunningSandbox] = {}
        #: The logs of sandboxes stopped at their lifetime, and when (monotonic seconds).
        self.ended_logs: dict[str, tuple[SandboxLog, float]] = {}
        self.warm_size = warm
        self.warm_limits = {"memory_gb": warm_memory_gb, "disk_gb": warm_disk_gb}
        self.warm: list[RunningSandbox] = []
        self._warming = 0
        self._free_slots: list[int] = []
        self._next_slot = itertools.count(1)
        self._starting: dict[str, asyncio.Task] = {}
        self._reaper: asyncio.Task | None = None
        #: This run's id: a restarted agent has another one and holds none of the old run's sandboxes.
        self.instance = secrets.token_hex(8)

    def _slot(self) -> int:
        return self._free_slots.pop() if self._free_slots else next(self._next_slot)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start_sandbox(self, spec: SandboxSpec, *, expires_at: float) -> RunningSandbox:
        """Start ``spec`` unless it runs already (concurrent calls share one start), from a warm
        sandbox when one fits."""
        if spec.sandbox_id in self.sandboxes:
            return self.sandboxes[spec.sandbox_id]
        task = self._starting.get(spec.sandbox_id)
        if task is not None:
            await task
            return self.sandboxes[spec.sandbox_id]
        warm = self._take_warm(spec)
        if warm is not None:
            self._refill()
            try:
                await warm.claim(with_slot(spec, warm.spec.slot), expires_at=expires_at)
            except OSError:  # its supervisor ended while it waited: start one anew
                await warm.stop()
                self._free_slots.append(warm.spec.slot)
            else:
                self.sandboxes[spec.sandbox_id] = warm
                return warm
        slot = self._slot()
        sandbox = RunningSandbox(self.host, with_slot(spec, slot), expires_at=expires_at, max_output_bytes=self.max_output_bytes)
        task = asyncio.ensure_future(sandbox.start())
        self._starting[spec.sandbox_id] = task
        task.add_done_callback(lambda _: self._starting.pop(spec.sandbox_id, None))
        try:
            await task
        except BaseException:
            self._free_slots.append(slot)
            raise
        self.sandboxes[spec.sandbox_id] = sandbox
        return sandbox

    def _take_warm(self, spec: SandboxSpec) -> RunningSandbox | None:
        """Return a started warm sandbox that can become ``spec`` (removed from the pool), or None."""
        fits = (spec.network == "none" and spec.image == "python:3.11" and spec.memory_gb <= self.warm_limits["memory_gb"]
                and spec.disk_gb <= self.warm_limits["disk_gb"])
        while fits and self.warm:
            sandbox = self.warm.pop()
            if not sandbox.ended:
                return sandbox
            self._tasks_stop(sandbox)
        return None

    def _refill(self) -> None:
        """Start warm sandboxes in the background until the pool is full again."""
        while len(self.warm) + self._warming < self.warm_size:
            self._warming += 1
            asyncio.ensure_future(self._warm_one())

    async def _warm_one(self) -> None:
        slot = self._slot()
        sandbox = RunningSandbox(self.host, warm_spec(slot, **self.warm_limits), expires_at=float("inf"),
                                 max_output_bytes=self.max_output_bytes)
        try:
            await sandbox.start()
        except (RuntimeRefusal, OSError):
            self._free_slots.append(slot)
            return
        finally:
            self._warming -= 1
        self.warm.append(sandbox)

    def _tasks_stop(self, sandbox: RunningSandbox) -> None:
        """Stop ``sandbox`` in the background, its slot free afterwards."""
        async def stop() -> None:
            await sandbox.stop()
            self._free_slots.append(sandbox.spec.slot)

        asyncio.ensure_future(stop())

    async def stop_sandbox(self, sandbox_id: str) -> None:
        """Stop a sandbox and delete its files (nothing when this agent does not hold it)."""
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.stop()
            self._free_slots.append(sandbox.spec.slot)

    async def reap(self) -> None:
        """Stop, every second, the sandboxes past their lifetime, keeping each one's log for Lab
        (which reads it when it reaps the sandbox) until ``ENDED_LOG_KEEP_S`` has passed."""
        while True:
            await asyncio.sleep(1)
            now = time.time()
            for sandbox_id, sandbox in list(self.sandboxes.items()):
                if sandbox.expires_at <= now:
                    self.ended_logs[sandbox_id] = (sandbox.log, time.monotonic())
                    await self.stop_sandbox(sandbox_id)
            for sandbox_id, (_, ended) in list(self.ended_logs.items()):
                if time.monotonic() - ended > ENDED_LOG_KEEP_S:
                    del self.ended_logs[sandbox_id]

    # --- ASGI --------------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await asyncio.to_thread(self.host.sweep)
                    self._reaper = asyncio.create_task(self.reap())
                    self._refill()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    for sandbox_id in list(self.sandboxes):
                        await self.stop_sandbox(sandbox_id)
                    while self.warm:
                        await self.warm.pop().stop()
                    if self.host.cgroups is not None:
                        self.host.cgroups.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            await self.dispatch(request, send)
        except AgentError as error:
            await send_json(send, error.status, error.body())

    async def dispatch(self, request: Request, send) -> None:
        if request.path == "/healthz":
            await send_json(send, 200, {"status": "ok", "sandboxes": len(self.sandboxes), "warm": len(self.warm),
                                        "memory_limit": "cgroup" if self.host.cgroups is not None else "rlimit",
                                        "disk_limit": "tmpfs" if self.host.disk_mounts else "file_size",
                                        "images": {name: images.current(self.host.images, name) for name in images.IMAGES}})
            return
        for pattern, name in _ROUTES:
            match = pattern.match(request.path)
            if match:
                break
        else:
            raise AgentError(404, "not_found", "No such route.")
        if name == "held":
            await self.held(request, send)
            return
        sandbox_id = match["sandbox"]
        if name == "prime":
            await prime.handle(self, request, send, sandbox_id, match["rest"])
            return
        grant = self.grant(request, sandbox_id)
        if name == "sandbox":
            await self.control(request, send, sandbox_id, grant)
            return
        if name == "logs":
            await self.logs(request, send, sandbox_id, grant)
            return
        sandbox = self.opened(sandbox_id)
        if name == "commands" and request.method == "POST":
            await self.commands(request, send, sandbox)
        elif name == "background" and request.method == "POST":
            command = parse_command(await request.json(), seconds_left=sandbox.expires_at - time.time())
            record = sandbox.start_background(command, f"bg_{secrets.token_hex(8)}")
            await send_json(send, 201, background_to_dict(record))
        elif name == "background_command" and request.method == "GET":
            record = sandbox.background.get(match["command"])
            if record is None:
                raise AgentError(404, "not_found", "No such background command.")
            await send_json(send, 200, background_to_dict(record))
        elif name == "files" and request.method == "PUT":
            data = await request.body(limit=MAX_UPLOAD_BYTES)
            path = await asyncio.to_thread(self.write_file, sandbox, _path(request), data)
            await send_json(send, 200, {"path": path, "size_bytes": len(data)})
        elif name == "files" and request.method == "GET":
            data, _ = await asyncio.to_thread(self.read_file, sandbox, _path(request))
            await send_bytes(send, 200, data, "application/octet-stream")
        else:
            raise AgentError(405, "method_not_allowed", f"{request.method} is not allowed here.")

    # --- access ------------------------------------------------------------------------------

    def grant(self, request: Request, sandbox_id: str) -> tokens.Grant:
        """Return the grant of the request's token for ``sandbox_id``: 401 without a valid token,
        404 (as for a sandbox not held here) when it opens another sandbox."""
        grant = tokens.verify(self.secret, tokens.bearer(request.headers))
        if grant is None:
            raise AgentError(401, "invalid_token", "A valid sandbox token is required (Authorization: Bearer sbt_...).")
        if not grant.opens(sandbox_id):
            raise AgentError(404, "not_found", "No such sandbox on this agent.")
        return grant

    def opened(self, sandbox_id: str) -> RunningSandbox:
        """Return the running sandbox ``sandbox_id``: 404 when this agent does not hold it, 409
        ``invalid_state`` when it ended (its lifetime, its limits)."""
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            raise AgentError(404, "not_found", "No such sandbox on this agent.")
        if sandbox.ended or sandbox.expires_at <= time.time():
            raise AgentError(409, "invalid_state", "The sandbox has ended.")
        return sandbox

    async def held(self, request: Request, send) -> None:
        """Answer ``GET /v1/sandboxes`` (control token): this run's ``instance`` and the ids of the
        sandboxes it holds, ended ones included until they are stopped."""
        if self.grant(request, "*").scope != tokens.CONTROL_SCOPE:
            raise AgentError(404, "not_found", "No such route.")
        if request.method != "GET":
            raise AgentError(405, "method_not_allowed", f"{request.method} is not allowed here.")
        await send_json(send, 200, {"instance": self.instance, "sandboxes": sorted(self.sandboxes)})

    async def control(self, request: Request, send, sandbox_id: str, grant: tokens.Grant) -> None:
        if grant.scope != tokens.CONTROL_SCOPE:
            raise AgentError(404, "not_found", "No such sandbox on this agent.")
        if request.method == "DELETE":
            await self.stop_sandbox(sandbox_id)
            self.ended_logs.pop(sandbox_id, None)
            await send_bytes(send, 204, b"", "application/json")
        elif request.method == "GET":
            sandbox = self.sandboxes.get(sandbox_id)
            if sandbox is None:
                raise AgentError(404, "not_found", "No such sandbox on this agent.")
            await send_json(send, 200, {"id": sandbox_id, "status": "ended" if sandbox.ended else "running",
                                        "host_uid": self.host.host_uid(sandbox.spec), "expires_at": sandbox.expires_at})
        elif request.method == "PUT":
            body = await request.json()
            try:
                spec = SandboxSpec(
                    sandbox_id=sandbox_id, image=str(body["image"]), cpu_cores=float(body["cpu_cores"]),
                    memory_gb=float(body["memory_gb"]), disk_gb=float(body["disk_gb"]), network=str(body.get("network", "none")),
                    environment={str(k): str(v) for k, v in body.get("environment", {}).items()},
                    start_command=_start_command(body.get("start_command") or []),
                )
                expires_at = float(body["expires_at"])
            except (KeyError, TypeError, ValueError, AttributeError):
                raise AgentError(400, "invalid_request", "The body must hold a sandbox's spec and expires_at.") from None
            try:
                sandbox = await self.start_sandbox(spec, expires_at=expires_at)
                sandbox.run_start_command()
            except RuntimeRefusal as error:
                if error.code in ("image_not_built", "unknown_image"):  # not the agent's fault: no retry helps
                    raise AgentError(409, error.code, error.message, param="image") from None
                raise AgentError(503, "start_failed", f"The sandbox could not start: {error}") from None
            except OSError as error:
                raise AgentError(503, "start_failed", f"The sandbox could not start: {error}") from None
            await send_json(send, 200, {"id": sandbox_id, "status": "running"})
        else:
            raise AgentError(405, "method_not_allowed", f"{request.method} is not allowed here.")

    async def logs(self, request: Request, send, sandbox_id: str, grant: tokens.Grant) -> None:
        """Answer ``GET /v1/sandboxes/{id}/logs`` (the control token alone: reading them is the
        control plane's, which records who did): the sandbox's log as text, an ended sandbox's
        too until it is stopped, and one stopped at its lifetime until Lab deletes it."""
        if grant.scope != tokens.CONTROL_SCOPE:
            raise AgentError(404, "not_found", "No such sandbox on this agent.")
        if request.method != "GET":
            raise AgentError(405, "method_not_allowed", f"{request.method} is not allowed here.")
        sandbox = self.sandboxes.get(sandbox_id)
        log = sandbox.log if sandbox is not None else self.ended_logs.get(sandbox_id, (None, 0.0))[0]
        if log is None:
            raise AgentError(404, "not_found", "No such sandbox on this agent.")
        await send_json(send, 200, {"logs": log.data.decode(errors="replace"), "truncated": log.dropped_bytes > 0})

    # --- data plane --------------------------------------------------------------------------

    async def commands(self, request: Request, send, sandbox: RunningSandbox) -> None:
        body = await request.json()
        streamed = isinstance(body, dict) and body.pop("stream", False) is True
        command = parse_command(body, seconds_left=sandbox.expires_at - time.time())
        if not streamed:
            try:
                result = await sandbox.run_to_end(command)
            except SandboxEnded:
                raise AgentError(409, "invalid_state", "The sandbox ended during the command.") from None
            await send_json(send, 200, {
                "stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code,
                "duration_ms": result.duration_ms, "timed_out": result.timed_out, "truncated": result.truncated,
                "oom_killed": result.oom_killed,
            })
            return
        await send_stream(send, 200, self.events(sandbox, command), "application/x-ndjson")

    async def events(self, sandbox: RunningSandbox, command: CommandRequest):
        """Yield a command's events as NDJSON lines (output as text, each stream cut at the
        agent's output limit), ``{"type": "exit", ...}`` last."""
        started = time.monotonic()
        sent = {"stdout": 0, "stderr": 0}
        truncated = False
        try:
            async with aclosing(sandbox.run(command)) as events:
                async for event in events:
                    if event.kind in sent:
                        room = self.max_output_bytes - sent[event.kind]
                        data = event.data[:max(0, room)]
                        truncated = truncated or len(event.data) > room
                        sent[event.kind] += len(data)
                        if data:
                            yield _line({"type": event.kind, "data": data.decode(errors="replace")})
                    elif event.kind == "started":
                        yield _line({"type": "started", "pid": event.pid})
                    elif event.kind == "exit":
                        if event.error:
                            yield _line({"type": "stderr", "data": event.error + "\n"})
                        yield _line({"type": "exit", "exit_code": event.exit_code, "timed_out": event.timed_out,
                                     "oom_killed": event.oom_killed, "truncated": truncated,
                                     "duration_ms": int((time.monotonic() - started) * 1000)})
        except SandboxEnded:
            yield _line({"type": "error", "code": "invalid_state", "message": "The sandbox ended during the command."})

    def write_file(self, sandbox: RunningSandbox, path: str, data: bytes) -> str:
        try:
            return self.host.write_file(sandbox.spec, path, data)
        except RuntimeRefusal as error:
            raise refusal(error, "path") from None

    def read_file(self, sandbox: RunningSandbox, path: str, *, offset: int | None = None, length: int | None = None) -> tuple[bytes, int]:
        try:
            return self.host.read_file(sandbox.spec, path, max_bytes=MAX_DOWNLOAD_BYTES, offset=offset, length=length)
        except RuntimeRefusal as error:
            raise refusal(error, "path") from None


def refusal(error: RuntimeRefusal, param: str) -> AgentError:
    """Map the runtime's refusal to the agent's answer."""
    if error.code == "file_not_found":
        return AgentError(404, "file_not_found", error.message, param=param)
    if error.code == "file_too_large":
        return AgentError(413, "file_too_large", error.message, param=param)
    if error.code == "disk_quota_exceeded":
        return AgentError(409, "disk_quota_exceeded", error.message, param=param)
    return AgentError(400, error.code, error.message, param=param)


def parse_command(body: Any, *, seconds_left: float) -> CommandRequest:
    """Return the command of a body ``{"command": str | [str], "timeout_s", "cwd", "env", "user"}``
    (a string runs under ``/bin/sh -c``; the timeout, default 60 s, is cut to the sandbox's
    remaining lifetime). AgentError 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise AgentError(400, "invalid_request", "The body must be a JSON object.")
    for key in body:
        if key not in ("command", "timeout_s", "cwd", "env", "user"):
            raise AgentError(400, "unknown_field", f"Unknown field {key!r}.", param=key)
    command = body.get("command")
    if isinstance(command, str) and command and "\x00" not in command:
        argv: tuple[str, ...] = ("/bin/sh", "-c", command)
    elif command and _is_argv(command):
        argv = tuple(command)
    else:
        raise AgentError(400, "invalid", "command must be a non-empty string or list of strings.", param="command")
    minimum, maximum, default = COMMAND_TIMEOUT_S
    timeout = body.get("timeout_s", default)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not minimum <= timeout <= maximum:
        raise AgentError(400, "out_of_range", f"timeout_s must be a number from {minimum} to {maximum}.", param="timeout_s")
    try:
        cwd = command_directory(body.get("cwd") or "")
    except RuntimeRefusal as error:
        raise AgentError(400, "invalid_path", error.message, param="cwd") from None
    environment = body.get("env") or {}
    if not isinstance(environment, dict) or len(environment) > 100 or not all(
        isinstance(name, str) and _VARIABLE.match(name) and isinstance(value, str) and "\x00" not in value
        for name, value in environment.items()
    ):
        raise AgentError(400, "invalid", "env must map shell-style names to strings (at most 100).", param="env")
    if body.get("user") not in (None, SANDBOX_USER):
        raise AgentError(400, "unknown_user", f"A sandbox has one user, {SANDBOX_USER!r} (uid 1000).", param="user")
    return CommandRequest(argv=argv, timeout_s=min(float(timeout), max(0.0, seconds_left)), cwd=cwd, environment=environment)


def _is_argv(value: Any) -> bool:
    """Whether ``value`` is a list of strings without NUL bytes (a command's argv)."""
    return isinstance(value, list) and all(isinstance(item, str) and "\x00" not in item for item in value)


def _start_command(value: Any) -> tuple[str, ...]:
    """Return a start command's argv from a control body (``_is_argv``); ValueError for anything else."""
    if not _is_argv(value):
        raise ValueError("start_command must be a list of strings")
    return tuple(value)


def background_to_dict(record) -> dict[str, Any]:
    """Return a background command's status: ``running`` or ``exited`` with its exit code and output."""
    return {
        "id": record.id, "status": "running" if record.ended_at is None else "exited", "exit_code": record.exit_code,
        "timed_out": record.timed_out, "oom_killed": record.oom_killed, "stdout": record.stdout.decode(errors="replace"),
        "stderr": record.stderr.decode(errors="replace"), "truncated": record.truncated,
        "started_at": record.started_at, "ended_at": record.ended_at,
    }


def _path(request: Request) -> str:
    """Return the ``path`` query parameter ('' when missing, which the runtime refuses as ``invalid_path``)."""
    return request.query.get("path", "")


def _line(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"
