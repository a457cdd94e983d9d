"""The local runtime's side of the host: each sandbox a folder under ``LAB_DATA_DIR/sandboxes/<id>``
holding its ``workspace`` and its ``tmp``, and one long-lived bubblewrap sandbox over them whose
first process is the agent's supervisor (docs/sandboxes.md "Isolation"). The agent
(``sandboxes.agent``) starts and talks to that process; this module builds its command line and
moves files in and out.

The sandbox runs under ``setpriv`` and ``prlimit`` (util-linux) then ``bwrap`` (``lab.lib.bubblewrap``): its own
user, mount, PID, IPC, UTS and network namespaces (only its own loopback; one whose policy
is ``egress`` also gets a firewalled way out, ``egress.py``), uid 1000 inside with every
capability dropped, its image's root file system as ``/`` (``sandboxes.images``:
Debian's Python 3.11 and a few packages, built on this machine by ``make sandbox-images``;
nothing of the host's ``/usr`` or ``/etc``), writable as a container's root is where Lab runs as
root (an overlay whose upper layer is on the sandbox's disk, ``rootfs``) and read-only otherwise,
the work directory writable at ``/workspace``, its own ``/tmp`` and nothing else of the host, and
Lab's seccomp filter (``lab.lib.seccomp``: new namespaces, mounts, tracing, keyrings, eBPF,
modules and the like fail with EPERM). Its resource limits (setrlimit(2) through prlimit) are processes, open files and file size (the
sandbox's disk), and its memory is held by a memory cgroup of its own (``cgroups.py``), or where
there is none by an address-space limit; each command also gets CPU seconds (cores × its timeout). When Lab runs as root, each sandbox also runs as a host uid of its own
(its slot in the block of ``HOST_UIDS_PER_AGENT`` uids the agent holds, ``claim_uid_block``: two
agents on one machine never share a uid), so the process limit counts that sandbox's processes
alone and a sandbox's files belong to no one else; otherwise every sandbox runs as Lab's user and
the process limit is added to that user's current count.

Its ``workspace``, ``tmp`` and its root's upper layer live on one tmpfs of the sandbox's disk size
(where the system lets the agent mount one), so all its files together stop there. They are bound by open descriptors (``--bind-fd``); bwrap still resolves
their paths as the sandbox's uid, so the folders above them get search permission for others
(``o+x``, never read: what Lab keeps there is 0700 and 0600). Files are read and written by the
agent through descriptors opened one path component at a time with ``O_NOFOLLOW``: a symlink a
command left is refused, never followed onto the host.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.lib.bubblewrap import base_arguments
from sandboxes import images as images_module
from sandboxes.runtime import rootfs
from sandboxes.runtime.base import WORKSPACE, RuntimeRefusal, SandboxSpec
from sandboxes.runtime.cgroups import MemoryCgroups
from sandboxes.runtime.paths import AREAS, ROOT, sandbox_parts

#: Host uids of sandboxes when Lab runs as root: HOST_UID_BASE + block × HOST_UIDS_PER_AGENT +
#: slot, each agent on the machine holding a block of its own (``claim_uid_block``).
HOST_UID_BASE = 200_000
HOST_UIDS_PER_AGENT = 10_000
HOST_UID_BLOCKS = 10
#: Where agents hold their uid blocks: one lock file per block, flock(2)-ed for the agent's life.
UID_BLOCK_LOCKS = Path("/run/lab-sandboxes")
#: Exit code of a command killed at its timeout (as coreutils' ``timeout`` says it).
TIMEOUT_EXIT_CODE = 124
#: The subfolders of a sandbox's ``disk`` holding its root's upper layer and overlayfs's work
#: directory (``rootfs``).
ROOT_UPPER = "root"
ROOT_WORK = "root-work"
#: mount(2)'s flag for resizing a mounted tmpfs (linux/mount.h).
_MS_REMOUNT = 32
#: The variables every command starts with, before the sandbox's and the command's own.
BASE_ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKSPACE,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
GIGABYTE = 1024**3


class LocalHost:
    """The sandboxes of this machine as folders and command lines (see the module's docstring).

    ``root`` holds the sandboxes' folders; ``max_processes`` and ``max_open_files`` are per sandbox.
    With ``cgroups``, each sandbox's memory is held by a memory cgroup of its own (its processes
    join it before bwrap starts; the OOM killer then acts inside it alone); without, by an
    address-space limit on each process. With ``disk_mounts``, a sandbox's ``disk`` folder (its
    ``workspace`` and ``tmp``) is a tmpfs of the sandbox's disk size, so that all its files
    together stop at it (ENOSPC); without, only each file is held (setrlimit's file size) and
    uploads are checked. ``disk_mounts`` is turned off at the first mount the system refuses.
    With ``writable_roots`` (and Lab running as root), each sandbox's ``/`` is its image under an
    overlay of its own (``rootfs``); turned off at the first overlay the system refuses, after
    which roots are the read-only image. ``uid_block`` is the block of host uids this agent holds (``claim_uid_block``). ``images`` is
    the folder of the sandbox images (``sandboxes.images``; default ``images.images_dir()``).
    """

    def __init__(
        self,
        root: Path,
        *,
        max_processes: int = 256,
        max_open_files: int = 1024,
        bwrap: str = "bwrap",
        prlimit: str = "prlimit",
        setpriv: str = "setpriv",
        cgroups: MemoryCgroups | None = None,
        disk_mounts: bool = True,
        writable_roots: bool = True,
        uid_block: int = 0,
        images: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.images = Path(images) if images is not None else images_module.images_dir()
        self.uid_block = uid_block
        self.cgroups = cgroups
        self.disk_mounts = disk_mounts
        self.writable_roots = writable_roots
        #: Per host uid, a user namespace mapping root to it (``rootfs``'s idmapped image layers).
        self._idmaps: dict[int, int] = {}
        self.max_processes = max_processes
        self.max_open_files = max_open_files
        self.bwrap = bwrap
        self.prlimit = prlimit
        self.setpriv = setpriv
        self._image_roots: dict[str, Path] = {}

    def without_host_paths(self, text: str) -> str:
        """``text`` (what this machine's tools printed as a sandbox started) with the machine's own
        paths left out, for a refusal a user reads: its tools named by their file name, its
        sandboxes', images' and cgroups' folders as ``<sandboxes>``, ``<images>`` and ``<cgroups>``."""
        replacements = {str(self.root): "<sandboxes>", str(self.images): "<images>"}
        if self.cgroups is not None:
            replacements[str(self.cgroups.parent)] = "<cgroups>"
        for tool in (self.bwrap, self.prlimit, self.setpriv):
            if os.path.isabs(tool):
                replacements[tool] = os.path.basename(tool)
        for path in sorted(replacements, key=len, reverse=True):  # a folder inside another first
            text = text.replace(path, replacements[path])
        return text

    # --- where things are -------------------------------------------------------------------

    def folder(self, spec: SandboxSpec) -> Path:
        """Return the host folder of the sandbox (its ``workspace`` and ``tmp`` inside)."""
        return self.root / spec.sandbox_id

    def disk(self, spec: SandboxSpec) -> Path:
        """Return the host folder holding the sandbox's files (a tmpfs of its disk size, mounted)."""
        return self.folder(spec) / "disk"

    def workdir(self, spec: SandboxSpec) -> Path:
        """Return the host folder that is ``/workspace`` inside the sandbox."""
        return self.disk(spec) / "workspace"

    def root_folder(self, spec: SandboxSpec) -> Path:
        """Return the host folder where the sandbox's writable root is mounted (when it has one)."""
        return self.folder(spec) / "root"

    def has_writable_root(self, spec: SandboxSpec) -> bool:
        """Return whether the sandbox's ``/`` is its overlay (``prepare`` mounted it), not the image."""
        return os.path.ismount(self.root_folder(spec))

    def host_uid(self, spec: SandboxSpec) -> int | None:
        """Return the host uid the sandbox runs as, or None when Lab cannot switch (not root).
        RuntimeRefusal when the slot is past the agent's block (no uid of another agent is lent)."""
        if os.geteuid() != 0:
            return None
        if not 0 <= spec.slot < HOST_UIDS_PER_AGENT:
            raise RuntimeRefusal(f"this machine runs at most {HOST_UIDS_PER_AGENT - 1} sandboxes at once")
        return HOST_UID_BASE + self.uid_block * HOST_UIDS_PER_AGENT + spec.slot

    def cgroup(self, spec: SandboxSpec) -> str:
        """Return the name of the sandbox's memory cgroup (by its slot: a warm sandbox keeps it)."""
        return f"slot-{spec.slot}"

    def set_memory(self, spec: SandboxSpec) -> None:
        """Hold the running sandbox to ``spec.memory_gb`` (its cgroup's limit; nothing without cgroups)."""
        if self.cgroups is not None:
            self.cgroups.set_limit(self.cgroup(spec), int(spec.memory_gb * GIGABYTE))

    def oom_kills(self, spec: SandboxSpec) -> int:
        """Return how many of the sandbox's processes the OOM killer has killed (0 without cgroups)."""
        return self.cgroups.oom_kills(self.cgroup(spec)) if self.cgroups is not None else 0

    def image_root(self, spec: SandboxSpec) -> Path:
        """Return the root file system of the sandbox's image (the folders above it made
        traversable for sandboxes' host uids, once). RuntimeRefusal ``image_not_built`` (saying
        how to build it) when this machine lacks it, ``unknown_image`` for a name Lab does not know."""
        path = self._image_roots.get(spec.image)
        if path is not None:
            return path
        try:
            path = images_module.rootfs(self.images, spec.image)
        except KeyError:
            raise RuntimeRefusal("unknown_image", f"This agent has no image {spec.image!r}.") from None
        except images_module.ImageNotBuilt as error:
            raise RuntimeRefusal("image_not_built", str(error)) from None
        if os.geteuid() == 0:
            _let_others_traverse(path)
        self._image_roots[spec.image] = path
        return path

    # --- lifecycle --------------------------------------------------------------------------

    def prepare(self, spec: SandboxSpec) -> None:
        """Create the sandbox's folder (0711) and its ``workspace`` and ``tmp`` (0700, owned by its
        host uid), and mount its writable root (``rootfs``, when Lab runs as root); idempotent.
        RuntimeRefusal ``image_not_built`` first when its image is missing."""
        image = self.image_root(spec)
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.folder(spec).mkdir(mode=0o711, exist_ok=True)
        self.disk(spec).mkdir(mode=0o711, exist_ok=True)
        if self.disk_mounts and not os.path.ismount(self.disk(spec)):
            self.disk_mounts = _mount_tmpfs(self.disk(spec), f"size={_disk_bytes(spec)},mode=0711")
        uid = self.host_uid(spec)
        if uid is not None:
            _let_others_traverse(self.disk(spec))
        for area in AREAS.values():
            path = self.disk(spec) / area
            path.mkdir(mode=0o700, exist_ok=True)
            if uid is not None:
                os.chown(path, uid, uid)
        if uid is not None and self.writable_roots and not self.has_writable_root(spec):
            self._mount_root(spec, image, uid)
        if self.cgroups is not None:
            self.cgroups.create(self.cgroup(spec), int(spec.memory_gb * GIGABYTE))

    def _mount_root(self, spec: SandboxSpec, image: Path, uid: int) -> None:
        """Mount the sandbox's root overlay at ``root_folder`` (upper layer on its disk, 0700: no
        other host user looks in); turn ``writable_roots`` off when the system refuses."""
        upper, work = self.disk(spec) / ROOT_UPPER, self.disk(spec) / ROOT_WORK
        for path in (upper, work, self.root_folder(spec)):
            path.mkdir(mode=0o700, exist_ok=True)
        self.writable_roots = rootfs.mount(image, target=self.root_folder(spec), upper=upper, work=work, uid=uid, idmaps=self._idmaps)

    def resize_disk(self, spec: SandboxSpec) -> None:
        """Set the running sandbox's disk to ``spec.disk_gb`` (its tmpfs remounted); OSError when
        the system refuses (a tmpfs may not shrink below what it holds)."""
        if os.path.ismount(self.disk(spec)) and not _mount_tmpfs(self.disk(spec), f"size={_disk_bytes(spec)}", flags=_MS_REMOUNT):
            raise OSError(ctypes.get_errno(), f"could not resize the disk of {spec.sandbox_id}")

    def remove(self, spec: SandboxSpec) -> None:
        """Delete the sandbox's folder (symlinks in it are removed, never followed; its tmpfs
        unmounted) and its cgroup (its processes must be gone)."""
        _unmount(self.folder(spec))
        shutil.rmtree(self.folder(spec), ignore_errors=True)
        if self.cgroups is not None:
            self.cgroups.remove(self.cgroup(spec))

    def sweep(self) -> int:
        """Delete what sandboxes of an earlier agent left under ``root`` (their processes ended
        with it, their mounts stayed); return how many folders. Only for a starting agent."""
        swept = 0
        for entry in self.root.iterdir() if self.root.is_dir() else ():
            if entry.name != ".system" and entry.is_dir() and not entry.is_symlink():
                _unmount(entry)
                shutil.rmtree(entry, ignore_errors=True)
                swept += 1
        return swept

    def command_line(self, spec: SandboxSpec, *, workspace_fd: int, tmp_fd: int, seccomp_fd: int, program: list[str]) -> list[str]:
        """Return the sandbox's command line: setpriv's identity (when Lab is root), prlimit's
        limits, then bwrap binding ``workspace_fd`` and ``tmp_fd`` and applying the seccomp filter
        it reads from ``seccomp_fd`` (``lab.lib.seccomp.memfd``), then ``program`` (its first process)."""
        uid = self.host_uid(spec)
        processes = self.max_processes
        if uid is None:
            processes += _processes_of(os.geteuid())
        # setpriv (util-linux) switches to the sandbox's host uid rather than Popen(user=...), which
        # would make Python fork the agent's whole process instead of vfork-ing it.
        identity = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
        # With a cgroup, the first process joins it (as root, before setpriv), and memory is the
        # cgroup's to hold: an address-space limit would fail allocations before any OOM kill.
        join = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cgroups.procs(self.cgroup(spec)))] if self.cgroups else []
        memory = [] if self.cgroups else [f"--as={int(spec.memory_gb * GIGABYTE)}"]
        limits = [
            self.prlimit,
            *memory,
            f"--nproc={processes}",
            f"--nofile={self.max_open_files}",
            f"--fsize={int(spec.disk_gb * GIGABYTE)}",
            "--core=0",
            "--",
        ]
        writable = self.has_writable_root(spec)
        args = base_arguments(
            # A network namespace of its own always: one allowed egress gets slirp4netns's (``egress``).
            hostname="sandbox", share_network=False, bwrap=self.bwrap, sysfs=False, seccomp_fd=seccomp_fd,
            root=str(self.root_folder(spec) if writable else self.image_root(spec)), writable_root=writable,
        )
        args += ["--bind-fd", str(workspace_fd), WORKSPACE, "--bind-fd", str(tmp_fd), "/tmp", "--chdir", WORKSPACE, "--clearenv"]
        for name, value in sorted(BASE_ENVIRONMENT.items()):
            args += ["--setenv", name, value]
        return [*join, *identity, *limits, *args, "--", *program]

    def environment(self, spec: SandboxSpec, command_environment: dict[str, str]) -> dict[str, str]:
        """Return a command's variables: Lab's few, then the sandbox's, then the command's."""
        return {**BASE_ENVIRONMENT, **spec.environment, **command_environment}

    # --- files ------------------------------------------------------------------------------

    def write_file(self, spec: SandboxSpec, path: str, data: bytes) -> str:
        """Write ``data`` at ``path`` (``sandbox_parts``: under /workspace, /tmp, or anywhere in a
        writable root; parents created), owned by the sandbox's uid; return the absolute path inside. Refused (RuntimeRefusal) when the sandbox's
        folder would hold more than its disk (``disk_quota_exceeded``), and when ``path`` is
        anything but a regular file there (``invalid_path``; a FIFO a command left is opened
        without blocking, then refused)."""
        area, parts = sandbox_parts(path)
        if disk_usage(self.disk(spec)) + len(data) > spec.disk_gb * GIGABYTE:
            raise RuntimeRefusal("disk_quota_exceeded", "The sandbox's disk is full.")
        uid = self.host_uid(spec)
        with self._directory(spec, area, parts[:-1], create=True) as directory:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=directory)
            except OSError as error:
                raise _path_refusal(error) from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise RuntimeRefusal("invalid_path", _NOT_A_FILE)
                os.ftruncate(fd, 0)
                if uid is not None:
                    os.fchown(fd, uid, uid)
                try:
                    with os.fdopen(fd, "wb", closefd=False) as handle:
                        handle.write(data)
                except OSError as error:
                    if error.errno in (28, 27):  # ENOSPC on its tmpfs, EFBIG past its file size
                        raise RuntimeRefusal("disk_quota_exceeded", "The sandbox's disk is full.") from None
                    raise
            finally:
                os.close(fd)
        return area.rstrip("/") + "/" + "/".join(parts)

    def read_file(self, spec: SandboxSpec, path: str, *, max_bytes: int, offset: int | None = None, length: int | None = None) -> tuple[bytes, int]:
        """Return a regular file's bytes (``offset``/``length`` a window of it; a negative offset
        counts from its end) and its whole size. Refused (RuntimeRefusal): ``invalid_path``,
        ``file_not_found``, ``file_too_large`` (the bytes asked for are over ``max_bytes``)."""
        area, parts = sandbox_parts(path)
        with self._directory(spec, area, parts[:-1], create=False) as directory:
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
            except OSError as error:
                raise _path_refusal(error) from None
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):  # a folder, a FIFO, a device: before Python's file object refuses it
                os.close(fd)
                raise RuntimeRefusal("invalid_path", _NOT_A_FILE)
            with os.fdopen(fd, "rb") as handle:
                size = status.st_size
                start = 0 if offset is None else (max(0, size + offset) if offset < 0 else min(offset, size))
                wanted = size - start if length is None else max(0, min(length, size - start))
                if wanted > max_bytes:
                    raise RuntimeRefusal("file_too_large", f"The file is larger than {max_bytes} bytes.")
                handle.seek(start)
                return handle.read(wanted), size

    @contextmanager
    def _directory(self, spec: SandboxSpec, area: str, parts: list[str], *, create: bool) -> Iterator[int]:
        """Yield a descriptor of the folder ``parts`` under the sandbox's ``area``, walked one
        component at a time without following a symlink (created, for the sandbox's uid, when asked).
        A path of the root (``ROOT``) of a sandbox whose root is the read-only image is refused."""
        uid = self.host_uid(spec)
        if area == ROOT and not self.has_writable_root(spec):
            raise RuntimeRefusal("invalid_path", "path must be inside /workspace or /tmp: this sandbox's root is read-only.")
        try:
            fd = os.open(self.root_folder(spec) if area == ROOT else self.disk(spec) / AREAS[area], os.O_DIRECTORY | os.O_NOFOLLOW)
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


def _disk_bytes(spec: SandboxSpec) -> int:
    return max(1024 * 1024, int(spec.disk_gb * GIGABYTE))


def _mount_tmpfs(path: Path, options: str, *, flags: int = 0) -> bool:
    """Mount (or with ``_MS_REMOUNT`` resize) a tmpfs at ``path``; return whether the system let us."""
    result = rootfs.libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, options.encode())
    return result == 0


def _unmount(folder: Path) -> None:
    """Detach a sandbox folder's mounts, its root overlay before the disk its upper layer is on."""
    rootfs.unmount(folder / "root")
    rootfs.unmount(folder / "disk")


#: Why a file route refuses a path that is there but is no regular file.
_NOT_A_FILE = "The path is not a regular file (a folder, a FIFO or a device): name a file."


def _path_refusal(error: OSError) -> RuntimeRefusal:
    """Map an OSError on a workspace path to the refusal a client sees."""
    if isinstance(error, FileNotFoundError):
        return RuntimeRefusal("file_not_found", "No such file in the sandbox.")
    if isinstance(error, IsADirectoryError):
        return RuntimeRefusal("invalid_path", _NOT_A_FILE)
    return RuntimeRefusal(
        "invalid_path",
        "The path goes through a symlink or something that is not a folder (/bin, /lib and /sbin are symlinks: name /usr/bin/..., /usr/lib/...).",
    )


def _let_others_traverse(folder: Path) -> None:
    """Add search permission for others (never read) to ``folder`` and its parents where it
    lacks: bwrap, run as the sandbox's uid, resolves the path of the work directory it binds.
    Lab's files under them stay its own (umask 077: 0600 and 0700)."""
    for path in (folder, *folder.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def claim_uid_block(locks: Path = UID_BLOCK_LOCKS) -> tuple[int, int]:
    """Claim a block of host uids no other agent on this machine holds: return ``(block, fd)``,
    the block held by an exclusive flock(2) on ``locks/uids-<block>.lock`` through ``fd`` until
    it is closed or the process ends (a killed agent frees its block). ``(0, -1)`` when not root
    (sandboxes then run as Lab's own user and no uid is switched). OSError when every one of the
    HOST_UID_BLOCKS blocks is held."""
    if os.geteuid() != 0:
        return 0, -1
    locks.mkdir(mode=0o700, parents=True, exist_ok=True)
    for block in range(HOST_UID_BLOCKS):
        fd = os.open(locks / f"uids-{block}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return block, fd
    raise OSError(f"every one of the {HOST_UID_BLOCKS} sandbox uid blocks of this machine is held by a running agent")


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
