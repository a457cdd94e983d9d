"""One sandbox as the agent holds it: its bubblewrap process with the supervisor inside, the
commands running there, and its background commands.

``RunningSandbox.start`` launches ``LocalHost.command_line`` with ``supervisor.py`` as the first
process and waits for its ``READY``; ``run`` sends it a command and yields the command's events;
``stop`` kills the sandbox's process group (bwrap, and with it the PID namespace: every process
of the sandbox) and deletes its folder. Frames from the supervisor are read by one task per
sandbox, bounded (``MAX_FRAME_BYTES``) and parsed strictly: the supervisor runs as the sandbox's
user, so nothing it says is trusted beyond that sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from lab.lib import egress, seccomp
from sandboxes.agent import supervisor as protocol
from sandboxes.runtime.base import CommandRequest, CommandResult, RuntimeRefusal, SandboxSpec
from sandboxes.runtime.local import GIGABYTE, LocalHost
from sandboxes.runtime.paths import AREAS

logger = logging.getLogger(__name__)

#: The supervisor's source, run inside the sandbox by the sandbox's own Python.
SUPERVISOR_SOURCE = Path(protocol.__file__).read_text()
#: The sandbox's first process: its Python, isolated from the environment and site packages.
SUPERVISOR_PROGRAM = ["python3", "-I", "-S", "-c", SUPERVISOR_SOURCE]
#: Largest frame read from a supervisor (its output chunks are 64 KiB).
MAX_FRAME_BYTES = 1024 * 1024
#: How long a sandbox may take to start (seconds), and the grace past a command's own timeout
#: before the agent gives up on its supervisor.
START_TIMEOUT_S = 10.0
EXIT_GRACE_S = 5.0
#: Frames a slow client may leave waiting per command before the sandbox's reader waits for it.
QUEUE_FRAMES = 64
#: What is kept of the sandbox's own stderr (bytes).
ERROR_BYTES = 2048
#: Background commands kept per sandbox (running or finished), and the output kept of each.
MAX_BACKGROUND = 256
#: What is kept of the output of a sandbox's commands, its log (bytes, the latest).
LOG_BYTES = 256 * 1024
#: The id under which a sandbox's start command shows as a background command.
START_COMMAND_ID = "bg_start"


class SandboxEnded(Exception):
    """The sandbox's supervisor is gone (deleted, past its lifetime, killed by its limits)."""


@dataclass
class Event:
    """One event of a command: ``kind`` is ``started`` (``pid``), ``stdout``/``stderr``
    (``data``) or ``exit`` (``exit_code``, ``timed_out``, ``error``)."""

    kind: str
    data: bytes = b""
    pid: int | None = None
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    oom_killed: bool = False


@dataclass
class SandboxLog:
    """What the commands of a sandbox printed, stdout and stderr in the order they came: the last
    ``limit`` bytes, and how many earlier ones were dropped."""

    limit: int = LOG_BYTES
    data: bytearray = field(default_factory=bytearray)
    dropped_bytes: int = 0

    def add(self, data: bytes) -> None:
        self.data += data
        excess = len(self.data) - self.limit
        if excess > 0:
            del self.data[:excess]
            self.dropped_bytes += excess


@dataclass
class BackgroundCommand:
    """A command started in the background: its output (the first ``limit`` bytes of each
    stream) and, once it ended, its exit code. Times are unix seconds."""

    id: str
    limit: int
    started_at: float = field(default_factory=time.time)
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    exit_code: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    ended_at: float | None = None

    def add(self, kind: str, data: bytes) -> None:
        buffer = self.stdout if kind == "stdout" else self.stderr
        room = self.limit - len(buffer)
        buffer += data[:max(0, room)]
        self.truncated = self.truncated or len(data) > room


class RunningSandbox:
    """A started sandbox of ``host`` (see the module's docstring); ``expires_at`` in unix seconds."""

    def __init__(self, host: LocalHost, spec: SandboxSpec, *, expires_at: float, max_output_bytes: int) -> None:
        self.host = host
        self.spec = spec
        self.expires_at = expires_at
        self.max_output_bytes = max_output_bytes
        self.process: asyncio.subprocess.Process | None = None
        self.ended = False
        self.background: dict[str, BackgroundCommand] = {}
        self.log = SandboxLog()
        self._streams: dict[int, asyncio.Queue] = {}
        self._numbers = itertools.count(1)
        self._reader: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self.errors = b""
        self._start_command_started = False
        #: A sandbox allowed egress: its slirp4netns and the descriptor whose closing ends it.
        self.network: tuple[subprocess.Popen, int] | None = None

    async def start(self) -> None:
        """Create the sandbox's folders, start its namespaces and supervisor, and wait until it
        answers. Raises RuntimeRefusal ``start_failed`` when it does not within START_TIMEOUT_S;
        whatever way it fails, what it made of the sandbox (folders, mounts, cgroup) is removed."""
        try:
            await self._spawn()
        except OSError as error:  # no bubblewrap, a mount or a cgroup refused: said without the host's paths
            await self.stop()
            raise RuntimeRefusal("start_failed", f"The sandbox could not start on its machine: {error.strerror or type(error).__name__}.") from None
        except BaseException:
            await self.stop()
            raise
        self._reader = asyncio.create_task(self._read())
        self._tasks.add(asyncio.create_task(self._read_errors()))
        try:
            await asyncio.wait_for(self._ready.wait(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            await self.stop()
            raise RuntimeRefusal("start_failed", "The sandbox did not start.") from None
        if self.ended:
            await self.stop()
            said = self.errors.decode(errors="replace").strip()
            if said:
                logger.warning("sandbox %s ended as it started: %s", self.spec.sandbox_id, said)  # the operator's, paths and all
            said = self.host.without_host_paths(said)
            raise RuntimeRefusal("start_failed", f"The sandbox ended as it started{': ' + said if said else '.'}")
        if self.spec.network == "egress":
            try:
                self.network = await asyncio.to_thread(egress.start, self.process.pid, uid=self.host.host_uid(self.spec))
            except (egress.EgressUnavailable, OSError, ValueError) as error:
                await self.stop()
                raise RuntimeRefusal("start_failed", f"The sandbox's network could not be set up: {error}") from None

    async def _spawn(self) -> None:
        """Create the sandbox's folders and mounts and start bubblewrap with its supervisor."""
        self.host.prepare(self.spec)
        fds = []
        try:
            for area in AREAS:
                fds.append(os.open(self.host.disk(self.spec) / AREAS[area], os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW))
            fds.append(seccomp.memfd())
            command = self.host.command_line(
                self.spec, workspace_fd=fds[0], tmp_fd=fds[1], seccomp_fd=fds[2], program=SUPERVISOR_PROGRAM,
            )
            self.process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=fds, start_new_session=True,
                limit=MAX_FRAME_BYTES + protocol.HEADER.size,
            )
        finally:
            for fd in fds:
                os.close(fd)

    async def _read_errors(self) -> None:
        """Keep the last ``ERROR_BYTES`` the sandbox's first processes (bwrap, the supervisor)
        wrote to stderr, for saying why a sandbox did not start."""
        assert self.process is not None and self.process.stderr is not None
        while chunk := await self.process.stderr.read(4096):
            self.errors = (self.errors + chunk)[-ERROR_BYTES:]

    async def _read(self) -> None:
        """Read the supervisor's frames and hand each to its command's queue, until it ends."""
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        try:
            while True:
                number, kind, length = protocol.HEADER.unpack(await stdout.readexactly(protocol.HEADER.size))
                if length > MAX_FRAME_BYTES:
                    break
                payload = await stdout.readexactly(length)
                if kind == protocol.READY:
                    self._ready.set()
                    continue
                queue = self._streams.get(number)
                if queue is not None:
                    await queue.put((kind, payload))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended = True
            self._ready.set()
            for queue in list(self._streams.values()):
                queue.put_nowait((None, b""))

    async def _send(self, number: int, kind: int, body: dict) -> None:
        assert self.process is not None and self.process.stdin is not None
        payload = json.dumps(body).encode()
        async with self._write_lock:
            self.process.stdin.write(protocol.HEADER.pack(number, kind, len(payload)) + payload)
            await self.process.stdin.drain()

    async def run(self, request: CommandRequest) -> AsyncIterator[Event]:
        """Start ``request`` and yield its events, ``exit`` last; its output (and the error an
        exit carries) goes to the sandbox's ``log`` too. Raises SandboxEnded when the sandbox ends
        first. A consumer that stops early has the command's group killed."""
        if self.ended:
            raise SandboxEnded()
        number = next(self._numbers)
        queue: asyncio.Queue = asyncio.Queue(QUEUE_FRAMES)
        self._streams[number] = queue
        exited = False
        oom_kills = self.host.oom_kills(self.spec)
        try:
            await self._send(number, protocol.RUN, {
                "argv": list(request.argv), "cwd": request.cwd, "timeout_s": request.timeout_s,
                "env": self.host.environment(self.spec, dict(request.environment)),
                "cpu_s": max(1, math.ceil(self.spec.cpu_cores * request.timeout_s)),
            })
            deadline = time.monotonic() + request.timeout_s + EXIT_GRACE_S
            while True:
                try:
                    kind, payload = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    raise SandboxEnded() from None
                if kind is None:
                    raise SandboxEnded()
                event = _event(kind, payload)
                if event is None:
                    continue
                exited = event.kind == "exit"
                if event.kind in ("stdout", "stderr"):
                    self.log.add(event.data)
                elif exited and event.error:
                    self.log.add(f"{event.error}\n".encode())
                if exited and event.exit_code == 128 + signal.SIGKILL and self.host.oom_kills(self.spec) > oom_kills:
                    event.oom_killed = True
                yield event
                if exited:
                    return
        except (ConnectionError, BrokenPipeError):
            raise SandboxEnded() from None
        finally:
            self._streams.pop(number, None)
            if not exited and not self.ended:
                try:
                    await self._send(number, protocol.SIGNAL, {"signal": int(signal.SIGKILL)})
                except (ConnectionError, BrokenPipeError, RuntimeError):
                    pass

    async def run_to_end(self, request: CommandRequest) -> CommandResult:
        """Run ``request`` and return its result, each stream cut at ``max_output_bytes``."""
        started = time.monotonic()
        output = {"stdout": bytearray(), "stderr": bytearray()}
        truncated = False
        async for event in self.run(request):
            if event.kind in output:
                buffer = output[event.kind]
                room = self.max_output_bytes - len(buffer)
                buffer += event.data[:max(0, room)]
                truncated = truncated or len(event.data) > room
            elif event.kind == "exit":
                stderr = bytes(output["stderr"]) + (f"{event.error}\n".encode() if event.error else b"")
                return CommandResult(
                    stdout=output["stdout"].decode(errors="replace"), stderr=stderr.decode(errors="replace"),
                    exit_code=event.exit_code, duration_ms=int((time.monotonic() - started) * 1000),
                    timed_out=event.timed_out, truncated=truncated, oom_killed=event.oom_killed,
                )
        raise SandboxEnded()

    def start_background(self, request: CommandRequest, command_id: str) -> BackgroundCommand:
        """Start ``request`` in the background under ``command_id``; return its record. Raises
        RuntimeRefusal ``too_many_commands`` past MAX_BACKGROUND (finished ones are dropped first)."""
        if len(self.background) >= MAX_BACKGROUND:
            for key in [key for key, command in self.background.items() if command.ended_at is not None]:
                del self.background[key]
        if len(self.background) >= MAX_BACKGROUND:
            raise RuntimeRefusal("too_many_commands", f"The sandbox already runs {MAX_BACKGROUND} background commands.")
        record = BackgroundCommand(id=command_id, limit=self.max_output_bytes)
        self.background[command_id] = record

        async def follow() -> None:
            try:
                async for event in self.run(request):
                    if event.kind in ("stdout", "stderr"):
                        record.add(event.kind, event.data)
                    elif event.kind == "exit":
                        record.exit_code, record.timed_out, record.oom_killed = event.exit_code, event.timed_out, event.oom_killed
                        if event.error:
                            record.add("stderr", f"{event.error}\n".encode())
            except SandboxEnded:
                record.exit_code = 137
            finally:
                record.ended_at = time.time()

        task = asyncio.create_task(follow())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return record

    def run_start_command(self) -> BackgroundCommand | None:
        """Start the spec's ``start_command`` once, as a background command (``START_COMMAND_ID``)
        whose timeout is the rest of the sandbox's lifetime: it runs as the sandbox's user with the
        sandbox's variables in ``/workspace``, like any command, its output goes to the sandbox's
        log, and it ends with the sandbox (or at its own exit). Return its record, or None when the
        sandbox has no start command."""
        if not self.spec.start_command:
            return None
        if not self._start_command_started:
            self._start_command_started = True
            request = CommandRequest(argv=tuple(self.spec.start_command), timeout_s=max(1.0, self.expires_at - time.time()))
            return self.start_background(request, START_COMMAND_ID)
        return self.background.get(START_COMMAND_ID)

    async def claim(self, spec: SandboxSpec, *, expires_at: float) -> None:
        """Make this started warm sandbox ``spec``: its folder renamed to ``spec``'s id (bwrap
        bound it by descriptor, so the sandbox keeps it), ``spec``'s memory and disk limits set by
        its supervisor on itself before any command (lowered: a warm sandbox starts at the largest;
        the agent may not set another uid's limits), its lifetime ``expires_at``. ``spec``'s slot
        and network must be this sandbox's."""
        assert spec.slot == self.spec.slot and spec.network == self.spec.network
        os.rename(self.host.folder(self.spec), self.host.folder(spec))
        self.spec = spec
        self.expires_at = expires_at
        self.host.set_memory(spec)
        self.host.resize_disk(spec)
        memory = None if self.host.cgroups is not None else int(spec.memory_gb * GIGABYTE)
        await self._send(0, protocol.LIMITS, {"address_space": memory, "file_size": int(spec.disk_gb * GIGABYTE)})

    async def stop(self) -> None:
        """Kill every process of the sandbox and delete its folder (idempotent)."""
        self.ended = True
        if self.process is not None and self.process.returncode is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.process.wait()
        if self.network is not None:
            slirp, exit_fd = self.network
            self.network = None
            os.close(exit_fd)  # slirp4netns ends when it closes; killed too, in case it hangs
            slirp.kill()
            await asyncio.to_thread(slirp.wait)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.to_thread(self.host.remove, self.spec)


def warm_spec(slot: int, *, memory_gb: float, disk_gb: float) -> SandboxSpec:
    """Return the spec a warm sandbox starts with: no network, the largest limits (a claim
    lowers them), named by its slot."""
    return SandboxSpec(sandbox_id=f".warm-{slot}", image="python:3.11", cpu_cores=1.0, memory_gb=memory_gb,
                       disk_gb=disk_gb, network="none", slot=slot, expires_at=math.inf)


def with_slot(spec: SandboxSpec, slot: int) -> SandboxSpec:
    """Return ``spec`` with the agent's ``slot`` (its host uid)."""
    return dataclasses.replace(spec, slot=slot)


def _event(kind: int, payload: bytes) -> Event | None:
    """Return the Event of a supervisor frame, or None for one that makes no sense."""
    if kind == protocol.STDOUT:
        return Event("stdout", data=payload)
    if kind == protocol.STDERR:
        return Event("stderr", data=payload)
    try:
        body = json.loads(payload)
        if kind == protocol.STARTED:
            return Event("started", pid=int(body["pid"]))
        if kind == protocol.EXITED:
            error = body.get("error")
            return Event("exit", exit_code=int(body["exit_code"]), timed_out=bool(body.get("timed_out")),
                         error=str(error)[:1000] if error else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None
