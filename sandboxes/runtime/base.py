"""What Lab needs of a runtime that holds sandboxes: start one, run a command in it, read and
write its files, destroy it.

The runtime sees plain values (``SandboxSpec``, ``CommandRequest``), never Lab's models. Lab's
one implementation is ``sandboxes.runtime.agent.AgentRuntime``, a client of the sandbox agent
(``sandboxes.agent``), which holds the sandboxes; clients reach the agent's data plane directly.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Where a sandbox's work directory appears inside it; commands start there.
WORKSPACE = "/workspace"


class RuntimeRefusal(Exception):
    """The runtime refuses a request (a path outside the workspace, a full disk): ``code`` is a
    stable identifier, ``message`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class SandboxSpec:
    """One sandbox as the runtime needs it: its id, image and limits (cores, GB), its network
    policy (``none`` or ``egress``), the variables each command starts with, its ``slot`` (a
    number of its own on the host, which the agent assigns), when its lifetime ends
    (``expires_at``, unix seconds) and its start command (``start_command``, an argv; empty for
    none): a process started with the sandbox that lives until the sandbox ends (Prime's
    ``start_command``, what a container's entry point is)."""

    sandbox_id: str
    image: str
    cpu_cores: float
    memory_gb: float
    disk_gb: float
    network: str = "none"
    environment: Mapping[str, str] = field(default_factory=dict)
    slot: int = 0
    expires_at: float = 0.0
    start_command: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommandRequest:
    """A command: ``argv`` as run, a timeout (seconds), a working directory inside the workspace
    (relative to it, or absolute under /workspace) and extra variables."""

    argv: tuple[str, ...]
    timeout_s: float
    cwd: str = WORKSPACE
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandResult:
    """What a command did: its output (each cut at the runtime's limit, ``truncated`` then),
    ``exit_code`` (128 + the signal for a killed process, 124 past its timeout, 137 with
    ``oom_killed`` when the sandbox's memory ran out), and how long it took (milliseconds)."""

    stdout: str
    stderr: str
    exit_code: int
    duration_ms: int
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False


class SandboxRuntime(abc.ABC):
    """A place that holds sandboxes. Every method takes the sandbox's ``SandboxSpec``."""

    @abc.abstractmethod
    def start(self, spec: SandboxSpec) -> None:
        """Make the sandbox ready for commands and files (idempotent)."""

    @abc.abstractmethod
    def run(self, spec: SandboxSpec, request: CommandRequest) -> CommandResult:
        """Run ``request`` in the sandbox and wait for it; every process it started is gone after."""

    @abc.abstractmethod
    def write_file(self, spec: SandboxSpec, path: str, data: bytes) -> str:
        """Write ``data`` at ``path`` in the workspace; return the absolute path inside the sandbox.
        Raises RuntimeRefusal ``invalid_path`` or ``disk_quota_exceeded``."""

    @abc.abstractmethod
    def read_file(self, spec: SandboxSpec, path: str, *, max_bytes: int) -> bytes:
        """Return the file at ``path`` in the workspace. Raises RuntimeRefusal ``invalid_path``,
        ``file_not_found`` or ``file_too_large`` (over ``max_bytes``)."""


    @abc.abstractmethod
    def destroy(self, spec: SandboxSpec) -> None:
        """Stop the sandbox's processes and delete its files (idempotent)."""
