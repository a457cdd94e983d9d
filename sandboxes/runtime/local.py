"""The local runtime: each sandbox a work directory under ``LAB_DATA_DIR/sandboxes/<id>`` and each
command a bubblewrap sandbox over it (docs/sandboxes.md "Isolation").

A command runs under ``setpriv`` and ``prlimit`` (util-linux) then ``bwrap`` (``lab.lib.bubblewrap``): its own
user, mount, PID, IPC, UTS and network namespaces (only its own loopback unless the sandbox's
policy is ``egress``), uid 1000 inside with every capability dropped, the system's ``/usr`` and a
few ``/etc`` files read-only (the image ``python:3.11`` is the host's own system Python for now),
the work directory writable at ``/workspace`` and nothing else of the host. Its resource limits
(setrlimit(2) through prlimit) are CPU seconds (cores × timeout), address space (the sandbox's
memory), processes, open files and file size (the sandbox's disk). When Lab runs as root, each
sandbox also runs as a host uid of its own (``HOST_UID_BASE`` + its slot), so the process limit
counts that sandbox's processes alone and a sandbox's files belong to no one else; otherwise every
sandbox runs as Lab's user and the process limit is added to that user's current count.

The work directory is bound by an open descriptor (``--bind-fd``); bwrap still resolves its path
as the sandbox's uid, so the folders above it get search permission for others (``o+x``, never
read: what Lab keeps there is 0700 and 0600). Files are read and written
by Lab through descriptors opened one path component at a time with ``O_NOFOLLOW``: a symlink a
command left in the workspace is refused, never followed onto the host.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.lib.bubblewrap import base_arguments, copy_etc
from sandboxes.runtime.base import (
    WORKSPACE,
    CommandRequest,
    CommandResult,
    RuntimeRefusal,
    SandboxRuntime,
    SandboxSpec,
)

#: Host uids of sandboxes when Lab runs as root: HOST_UID_BASE + (slot mod HOST_UID_COUNT).
HOST_UID_BASE = 200_000
HOST_UID_COUNT = 100_000
#: Exit code of a command killed at its timeout (as coreutils' ``timeout`` says it).
TIMEOUT_EXIT_CODE = 124
#: The variables every command starts with, before the sandbox's and the command's own.
BASE_ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKSPACE,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
GIGABYTE = 1024**3


class LocalRuntime(SandboxRuntime):
    """Sandboxes on this machine (see the module's docstring).

    ``root`` holds the work directories; ``max_processes`` and ``max_open_files`` are per
    command; ``max_output_bytes`` cuts stdout and stderr each.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_processes: int = 256,
        max_open_files: int = 1024,
        max_output_bytes: int = 1024 * 1024,
        bwrap: str = "bwrap",
        prlimit: str = "prlimit",
        setpriv: str = "setpriv",
    ) -> None:
        self.root = Path(root)
        self.max_processes = max_processes
        self.max_open_files = max_open_files
        self.max_output_bytes = max_output_bytes
        self.bwrap = bwrap
        self.prlimit = prlimit
        self.setpriv = setpriv
        self._etc_copy: Path | None = None

    # --- where things are -------------------------------------------------------------------

    def workdir(self, spec: SandboxSpec) -> Path:
        """Return the host folder that is ``/workspace`` inside the sandbox."""
        return self.root / spec.sandbox_id

    def host_uid(self, spec: SandboxSpec) -> int | None:
        """Return the host uid the sandbox runs as, or None when Lab cannot switch (not root)."""
        if os.geteuid() != 0:
            return None
        return HOST_UID_BASE + spec.slot % HOST_UID_COUNT

    def _etc(self) -> Path:
        """Return this runtime's copy of the /etc files sandboxes see (made once per process)."""
        if self._etc_copy is None:
            self._etc_copy = copy_etc(self.root / ".system")
        return self._etc_copy

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, spec: SandboxSpec) -> None:
        """Create the work directory (mode 0700, owned by the sandbox's host uid)."""
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        workdir = self.workdir(spec)
        workdir.mkdir(mode=0o700, exist_ok=True)
        uid = self.host_uid(spec)
        if uid is not None:
            _let_others_traverse(self.root)
            os.chown(workdir, uid, uid)

    def destroy(self, spec: SandboxSpec) -> None:
        """Delete the work directory (symlinks in it are removed, never followed). A sandbox has
        no process between commands: each command's PID namespace ends with the command."""
        shutil.rmtree(self.workdir(spec), ignore_errors=True)

    # --- commands ---------------------------------------------------------------------------

    def command_line(self, spec: SandboxSpec, request: CommandRequest, workdir_fd: int) -> list[str]:
        """Return the full command line: setpriv's identity (when Lab is root), prlimit's limits,
        then bwrap, then ``request.argv``."""
        cpu_seconds = max(1, math.ceil(spec.cpu_cores * request.timeout_s))
        uid = self.host_uid(spec)
        processes = self.max_processes
        if uid is None:
            processes += _processes_of(os.geteuid())
        # setpriv (util-linux) switches to the sandbox's host uid rather than Popen(user=...), which
        # would make Python fork Lab's whole process instead of vfork-ing it (tens of ms per command).
        identity = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
        limits = [
            self.prlimit,
            f"--cpu={cpu_seconds}",
            f"--as={int(spec.memory_gb * GIGABYTE)}",
            f"--nproc={processes}",
            f"--nofile={self.max_open_files}",
            f"--fsize={int(spec.disk_gb * GIGABYTE)}",
            "--core=0",
            "--",
        ]
        args = base_arguments(
            hostname="sandbox", share_network=spec.network == "egress", bwrap=self.bwrap,
            etc=str(self._etc()), sysfs=False,
        )
        args += ["--bind-fd", str(workdir_fd), WORKSPACE, "--chdir", _inside(request.cwd), "--clearenv"]
        environment = {**BASE_ENVIRONMENT, **spec.environment, **request.environment}
        for name, value in sorted(environment.items()):
            args += ["--setenv", name, value]
        return [*identity, *limits, *args, "--", *request.argv]

    def run(self, spec: SandboxSpec, request: CommandRequest) -> CommandResult:
        """Run ``request`` and wait for it, at most ``request.timeout_s`` seconds: past that the
        whole sandbox (its PID namespace) is killed and the exit code is 124."""
        started = time.monotonic()
        timed_out = False
        workdir_fd = os.open(self.workdir(spec), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
                process = subprocess.Popen(
                    self.command_line(spec, request, workdir_fd),
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    pass_fds=(workdir_fd,),
                    start_new_session=True,
                    close_fds=True,
                )
                try:
                    returncode = process.wait(timeout=request.timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(process)
                    returncode = process.wait()
                duration_ms = int((time.monotonic() - started) * 1000)
                out, out_cut = _read_capped(stdout, self.max_output_bytes)
                err, err_cut = _read_capped(stderr, self.max_output_bytes)
        finally:
            os.close(workdir_fd)
        exit_code = TIMEOUT_EXIT_CODE if timed_out else (128 - returncode if returncode < 0 else returncode)
        return CommandResult(
            stdout=out, stderr=err, exit_code=exit_code, duration_ms=duration_ms,
            timed_out=timed_out, truncated=out_cut or err_cut,
        )

    # --- files ------------------------------------------------------------------------------

    def write_file(self, spec: SandboxSpec, path: str, data: bytes) -> str:
        """Write ``data`` at ``path`` (parents created), owned by the sandbox's uid; refused when
        the workspace would hold more than the sandbox's disk, and when ``path`` is anything but a
        regular file (a FIFO a command left is opened without blocking, then refused)."""
        parts = workspace_parts(path)
        if disk_usage(self.workdir(spec)) + len(data) > spec.disk_gb * GIGABYTE:
            raise RuntimeRefusal("disk_quota_exceeded", "The sandbox's disk is full.")
        uid = self.host_uid(spec)
        with self._directory(spec, parts[:-1], create=True) as directory:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=directory)
            except OSError as error:
                raise _path_refusal(error) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise RuntimeRefusal("invalid_path", "The path is not a regular file.")
                os.ftruncate(fd, 0)
                if uid is not None:
                    os.fchown(fd, uid, uid)
                with os.fdopen(fd, "wb", closefd=False) as handle:
                    handle.write(data)
            finally:
                os.close(fd)
        return WORKSPACE + "/" + "/".join(parts)

    def read_file(self, spec: SandboxSpec, path: str, *, max_bytes: int) -> bytes:
        """Return the regular file at ``path`` (at most ``max_bytes``)."""
        parts = workspace_parts(path)
        with self._directory(spec, parts[:-1], create=False) as directory:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
            except OSError as error:
                raise _path_refusal(error) from None
            with os.fdopen(fd, "rb") as handle:
                status = os.fstat(handle.fileno())
                if not stat.S_ISREG(status.st_mode):
                    raise RuntimeRefusal("invalid_path", "The path is not a regular file.")
                if status.st_size > max_bytes:
                    raise RuntimeRefusal("file_too_large", f"The file is larger than {max_bytes} bytes.")
                return handle.read(max_bytes + 1)[:max_bytes]

    @contextmanager
    def _directory(self, spec: SandboxSpec, parts: list[str], *, create: bool) -> Iterator[int]:
        """Yield a descriptor of the folder ``parts`` under the work directory, walked one
        component at a time without following a symlink (created, for the sandbox's uid, when asked)."""
        uid = self.host_uid(spec)
        try:
            fd = os.open(self.workdir(spec), os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise RuntimeRefusal("file_not_found", "The sandbox has no files.") from None
        try:
            for part in parts:
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        if uid is not None:
                            os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                    except FileExistsError:
                        pass
                    except OSError as error:
                        raise _path_refusal(error) from None
                try:
                    child = os.open(part, os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as error:
                    raise _path_refusal(error) from None
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)


def workspace_parts(path: str) -> list[str]:
    """Return the components of ``path`` below /workspace (``"a/b"`` or ``"/workspace/a/b"``);
    raise RuntimeRefusal ``invalid_path`` for anything that is not a plain path inside it."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
        raise RuntimeRefusal("invalid_path", "path must name a file in /workspace.")
    relative = path
    if path.startswith("/"):
        if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
            raise RuntimeRefusal("invalid_path", "path must be inside /workspace.")
        relative = path[len(WORKSPACE):]
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise RuntimeRefusal("invalid_path", "path must name a file in /workspace, without '..'.")
    return parts


def _inside(cwd: str) -> str:
    """Return the working directory inside the sandbox for ``cwd`` (the workspace itself when
    empty); refuses paths outside it like ``workspace_parts``."""
    if cwd in ("", ".", WORKSPACE, WORKSPACE + "/"):
        return WORKSPACE
    return WORKSPACE + "/" + "/".join(workspace_parts(cwd))


def disk_usage(directory: Path) -> int:
    """Return the bytes the files under ``directory`` take (allocated blocks; symlinks not followed)."""
    total = 0
    stack = [str(directory)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                status = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += status.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


def _path_refusal(error: OSError) -> RuntimeRefusal:
    """Map an OSError on a workspace path to the refusal a client sees."""
    if isinstance(error, FileNotFoundError):
        return RuntimeRefusal("file_not_found", "No such file in the sandbox.")
    return RuntimeRefusal("invalid_path", "The path is not a plain file or folder of /workspace (a symlink?).")


def _let_others_traverse(folder: Path) -> None:
    """Add search permission for others (never read) to ``folder`` and its parents where it
    lacks: bwrap, run as the sandbox's uid, resolves the path of the work directory it binds.
    Lab's files under them stay its own (umask 077: 0600 and 0700)."""
    for path in (folder, *folder.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the command's process group: bwrap, then (it dies with its parent) the sandbox's
    PID namespace and everything in it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_capped(handle, limit: int) -> tuple[str, bool]:
    """Return the first ``limit`` bytes written to ``handle`` as text, and whether there was more."""
    handle.seek(0)
    data = handle.read(limit + 1)
    return data[:limit].decode(errors="replace"), len(data) > limit


def _processes_of(uid: int) -> int:
    """Return how many processes ``uid`` has now (RLIMIT_NPROC counts them all when sandboxes
    share Lab's user)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                continue
    return count
