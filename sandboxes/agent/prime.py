"""Prime's sandbox gateway on the agent, as ``prime-sandboxes`` 0.5.1 calls it
(docs/prime-compat.md "Sandboxes"): its ``/sandbox/{id}/auth`` answer from Lab points it at
``<agent>/prime/<sandbox id>``, where it finds

- ``POST /command_session.CommandSession/Start``: Connect RPC, a server stream of
  ``StartResponse`` events (start, stdout/stderr data, end with the exit code) for one command,
  what ``execute_command`` (and so ``start_background_job`` and its status) sends;
- ``POST /exec``: ``{"command", "working_dir", "env", "timeout", "user"}`` → ``{"stdout", "stderr",
  "exit_code"}``, what ``execute_command`` of the releases before 0.3.0 sends for a container
  sandbox (verifiers' ``PythonEnv`` loads with those alone: docs/environments.md), a 408 past its
  timeout;
- ``POST /upload?path=`` (multipart field ``file``), ``GET /download?path=``,
  ``GET /read-file?path=&offset=&length=`` (a negative offset reads the file's tail).

Tokens are Lab's sandbox tokens (``tokens.py``). Errors follow the gateway's conventions that
the SDK reads: 401 (it fetches a new token once), 404 for a file, 410
``{"error": "sandbox_terminated"}`` for a sandbox that ended, 502 ``{"error":
"sandbox_not_found"}`` for one this agent does not hold; over RPC ``UNAUTHENTICATED``,
``NOT_FOUND`` (sandbox gone) and ``DEADLINE_EXCEEDED`` (the command's timeout).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from contextlib import aclosing
from datetime import datetime, timezone
from email.parser import BytesParser
from email.policy import HTTP

from connectrpc.code import Code
from connectrpc.compat import google_protobuf_codecs
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo
from connectrpc.server import ConnectASGIApplication, Endpoint

from sandboxes.agent import tokens
from sandboxes.agent.command_session import SERVICE, StartRequest, StartResponse
from sandboxes.agent.http import AgentError, Request, send_bytes, send_json
from sandboxes.agent.sandbox import SandboxEnded
from sandboxes.runtime.base import CommandRequest, RuntimeRefusal
from sandboxes.runtime.paths import command_directory

#: The command timeout when the client sends no deadline (seconds; the SDK always sends one).
DEFAULT_TIMEOUT_S = 300.0
MAX_UPLOAD_BYTES = 64 * 1024 * 1024
_START = MethodInfo(name="Start", service_name=SERVICE, input=StartRequest, output=StartResponse,
                    idempotency_level=IdempotencyLevel.UNKNOWN)
_current: contextvars.ContextVar = contextvars.ContextVar("prime_gateway_call")


class _CommandSessionApp(ConnectASGIApplication):
    """The Connect application serving ``CommandSession.Start`` for the agent in ``_current``."""

    @property
    def path(self) -> str:
        return f"/{SERVICE}"


async def _start(request, context):
    """Run the request's command in the sandbox of this call and stream its events."""
    agent, sandbox_id = _current.get()
    token = tokens.bearer({"authorization": context.request_headers.get("authorization", "")})
    grant = tokens.verify(agent.secret, token)
    if grant is None or not grant.opens(sandbox_id):
        raise ConnectError(Code.UNAUTHENTICATED, "A valid token for this sandbox is required.")
    sandbox = agent.sandboxes.get(sandbox_id)
    if sandbox is None or sandbox.ended or sandbox.expires_at <= time.time():
        raise ConnectError(Code.NOT_FOUND, "The sandbox has ended or is not on this agent.")
    spec = request.command
    if spec.HasField("user") and spec.user != "sandbox":
        raise ConnectError(Code.INVALID_ARGUMENT, "A sandbox has one user, 'sandbox' (uid 1000).")
    if not spec.cmd or request.HasField("pty") or request.stdin:
        raise ConnectError(Code.UNIMPLEMENTED, "Only a command with its arguments runs here (no PTY, no stdin).")
    try:
        cwd = command_directory(spec.cwd if spec.HasField("cwd") else "")
    except RuntimeRefusal as error:
        raise ConnectError(Code.INVALID_ARGUMENT, error.message) from None
    deadline_s = (context.timeout_ms / 1000.0) if context.timeout_ms is not None else DEFAULT_TIMEOUT_S
    timeout_s = _timeout_s(sandbox, deadline_s)
    command = CommandRequest(argv=(spec.cmd, *spec.args), timeout_s=timeout_s, cwd=cwd, environment=dict(spec.envs))
    try:
        async with aclosing(sandbox.run(command)) as events:
            async for event in events:
                response = StartResponse()
                if event.kind == "started":
                    response.event.start.pid = event.pid
                elif event.kind == "stdout":
                    response.event.data.stdout = event.data
                elif event.kind == "stderr":
                    response.event.data.stderr = event.data
                elif event.timed_out:
                    raise ConnectError(Code.DEADLINE_EXCEEDED, f"The command ran past its {timeout_s:g} s.")
                else:
                    if event.error:
                        error = StartResponse()
                        error.event.data.stderr = f"{event.error}\n".encode()
                        yield error
                    response.event.end.exit_code = event.exit_code
                    response.event.end.exited = True
                    response.event.end.status = f"exit status {event.exit_code}"
                yield response
    except SandboxEnded:
        raise ConnectError(Code.NOT_FOUND, "The sandbox ended during the command.") from None


_APP = _CommandSessionApp(
    service=None, endpoints=lambda _: {f"/{SERVICE}/Start": Endpoint.server_stream(_START, _start)},
    read_max_bytes=4 * 1024 * 1024, codecs=google_protobuf_codecs(),
)


async def handle(agent, request: Request, send, sandbox_id: str, rest: str) -> None:
    """Serve one request of Prime's gateway for ``sandbox_id`` (``rest``: the path after it)."""
    if rest.startswith(f"/{SERVICE}/"):
        token = _current.set((agent, sandbox_id))
        try:
            await _APP({**request.scope, "path": rest, "root_path": ""}, request.receive, send)
        finally:
            _current.reset(token)
        return
    grant = tokens.verify(agent.secret, tokens.bearer(request.headers))
    if grant is None or not grant.opens(sandbox_id):
        await send_json(send, 401, {"error": "unauthorized", "detail": "A valid token for this sandbox is required."})
        return
    sandbox = agent.sandboxes.get(sandbox_id)
    if sandbox is None:
        await send_json(send, 502, {"error": "sandbox_not_found", "detail": "The sandbox is not on this agent."})
        return
    if sandbox.ended or sandbox.expires_at <= time.time():
        await send_json(send, 410, {"error": "sandbox_terminated", "detail": "The sandbox has ended."})
        return
    path = request.query.get("path", "")
    try:
        if rest == "/exec" and request.method == "POST":
            await _exec(sandbox, await request.json(), send)
        elif rest == "/upload" and request.method == "POST":
            data = _multipart_file(await request.body(limit=MAX_UPLOAD_BYTES + 65536), request.headers.get("content-type", ""))
            written = await asyncio.to_thread(agent.write_file, sandbox, path, data)
            await send_json(send, 200, {"success": True, "path": written, "size": len(data),
                                        "timestamp": datetime.now(timezone.utc).isoformat()})
        elif rest == "/download" and request.method == "GET":
            data, _ = await asyncio.to_thread(agent.read_file, sandbox, path)
            await send_bytes(send, 200, data, "application/octet-stream")
        elif rest == "/read-file" and request.method == "GET":
            offset, length = _integer(request.query.get("offset")), _integer(request.query.get("length"))
            data, size = await asyncio.to_thread(agent.read_file, sandbox, path, offset=offset, length=length)
            start = 0 if offset is None else (max(0, size + offset) if offset < 0 else min(offset, size))
            await send_json(send, 200, {"content": data.decode(errors="replace"), "size": len(data), "total_size": size,
                                        "offset": start, "truncated": start > 0 or start + len(data) < size})
        else:
            await send_json(send, 404, {"error": "not_found", "detail": "No such route of the gateway."})
    except AgentError as error:
        await send_json(send, error.status, {"error": error.code, "detail": error.message})


async def _exec(sandbox, body, send) -> None:
    """Run ``body``'s command under ``/bin/bash -c`` (as ``CommandSession.Start`` runs it) and
    answer its output and exit code; 408 past its ``timeout`` (seconds, default 300, cut to the
    sandbox's lifetime and Lab's 3600), 410 when the sandbox ends during it."""
    if not isinstance(body, dict) or not isinstance(body.get("command"), str) or not body["command"]:
        raise AgentError(400, "invalid_request", "The body must hold a command string.")
    if body.get("user") not in (None, "sandbox"):
        raise AgentError(400, "invalid_request", "A sandbox has one user, 'sandbox' (uid 1000).")
    environment = body.get("env") or {}
    if not isinstance(environment, dict) or not all(isinstance(v, str) for v in environment.values()):
        raise AgentError(400, "invalid_request", "env must be an object of strings.")
    timeout = body.get("timeout") or DEFAULT_TIMEOUT_S
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise AgentError(400, "invalid_request", "timeout must be a positive number of seconds.")
    try:
        cwd = command_directory(body.get("working_dir") or "")
    except RuntimeRefusal as error:
        raise AgentError(400, "invalid_path", error.message) from None
    timeout_s = _timeout_s(sandbox, float(timeout))
    command = CommandRequest(argv=("/bin/bash", "-c", body["command"]), timeout_s=timeout_s, cwd=cwd,
                             environment={str(k): v for k, v in environment.items()})
    try:
        result = await sandbox.run_to_end(command)
    except SandboxEnded:
        raise AgentError(410, "sandbox_terminated", "The sandbox ended during the command.") from None
    if result.timed_out:
        raise AgentError(408, "command_timeout", f"The command ran past its {timeout_s:g} s.")
    await send_json(send, 200, {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code})


def _timeout_s(sandbox, requested_s: float) -> float:
    """A command's timeout: the seconds asked for, cut to the sandbox's lifetime and Lab's 3600."""
    return max(0.001, min(requested_s, sandbox.expires_at - time.time(), 3600.0))


def _integer(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise AgentError(400, "invalid_request", "offset and length must be whole numbers.") from None


def _multipart_file(body: bytes, content_type: str) -> bytes:
    """Return the ``file`` part of a ``multipart/form-data`` body; AgentError 400 without one."""
    if not content_type.startswith("multipart/form-data"):
        raise AgentError(400, "invalid_request", "The upload must be multipart/form-data with a 'file' part.")
    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    for part in message.iter_parts() if message.is_multipart() else ():
        if part.get_param("name", header="content-disposition") == "file":
            return part.get_payload(decode=True) or b""
    raise AgentError(400, "invalid_request", "The upload has no 'file' part.")
