"""The part of a bubblewrap (``bwrap``) command line that every sandbox of Lab shares.

Both the local launcher's engine sandbox (``jobs.launchers.isolation``) and user sandboxes
(``sandboxes.runtime.local``) start from ``base_arguments``: new user, PID, IPC, UTS, cgroup and
(unless shared) network namespaces, uid and gid 1000 inside, every capability dropped, no nested
user namespaces, the sandbox killed with the process that started it, fresh ``/tmp``, ``/dev``
and ``/proc``, the system's programs and libraries (``/usr`` and the few ``/etc`` files a
program needs) bound read-only, and Lab's seccomp filter (``lab.lib.seccomp``), which bwrap
applies after setting up the namespaces. Each caller then adds its own binds and its command.

``bubblewrap`` (https://github.com/containers/bubblewrap) is Debian's package of that name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from lab.lib import seccomp

#: The uid and gid a sandboxed process has inside (as in the engine pods' security context).
SANDBOX_UID = 1000
#: System folders bound read-only where present (symlinks to /usr on merged-/usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The files and folders of /etc that programs need (the dynamic loader's cache, certificates,
#: time zones, name service switch, users, pip's configuration); the rest of /etc stays out.
ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates", "ca-certificates.conf",
    "alternatives", "localtime", "timezone", "zoneinfo", "nsswitch.conf", "hosts", "passwd", "group",
    "mime.types", "os-release", "xdg", "pip.conf", "gai.conf", "host.conf",
)


def base_arguments(
    *, hostname: str, share_network: bool = False, bwrap: str = "bwrap", etc: str | None = None, sysfs: bool = True,
    seccomp_fd: int | None = None, root: str | None = None, writable_root: bool = False,
) -> list[str]:
    """Return the start of a ``bwrap`` command line: namespaces, identity, fresh kernel file
    systems and the read-only system folders (see the module's docstring).

    ``share_network`` keeps the host's network namespace (every address the host reaches);
    otherwise the sandbox has only its own loopback. ``etc`` names a folder holding copies of
    ``ETC_ENTRIES`` (``copy_etc``) bound as ``/etc`` in one mount instead of one per entry, and
    ``sysfs`` False leaves ``/sys`` out: each mount costs a sandbox's start about half a
    millisecond, ``/sys`` (with its submounts) about ten.

    ``seccomp_fd`` is a descriptor the caller passes on to bwrap (``seccomp.memfd``) holding the
    seccomp filter; without one, the command line starts with ``seccomp.file_prefix``, which
    opens the filter's file for bwrap.

    ``root`` names a root file system (a sandbox image, ``sandboxes.images``) bound read-only as
    ``/`` in place of the host's system folders and ``etc``: the sandbox then sees that image and
    the fresh ``/tmp``, ``/dev`` and ``/proc`` alone (the image must hold those folders, and any
    other mount point a caller binds onto). With ``writable_root``, ``root`` is bound writable: the
    caller gives a folder of the sandbox's own (an overlay over an image, ``sandboxes.runtime.rootfs``).
    """
    args = [
        *(seccomp.file_prefix() if seccomp_fd is None else []),
        bwrap,
        "--seccomp", str(seccomp.FILE_FD if seccomp_fd is None else seccomp_fd),
        "--unshare-all", "--unshare-user", "--disable-userns",
        *(["--share-net"] if share_network else []),
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--hostname", hostname,
        *([("--bind" if writable_root else "--ro-bind"), root, "/"] if root is not None else []),
        "--tmpfs", "/tmp",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/dev/shm",
        *(["--ro-bind-try", "/sys", "/sys"] if sysfs else []),
    ]
    if root is not None:
        return args
    for directory in SYSTEM_DIRS:
        args += ["--ro-bind-try", directory, directory]
    if etc is not None:
        return [*args, "--ro-bind", etc, "/etc"]
    for entry in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{entry}", f"/etc/{entry}"]
    return args


def copy_etc(destination: Path) -> Path:
    """Copy the ``ETC_ENTRIES`` of the host's /etc that exist into a new folder under
    ``destination`` named by their contents (``etc-<sha256 prefix>``), unless it exists; return it.

    Symlinks are copied as symlinks (``ssl/certs`` points into /usr, which sandboxes see).
    Several processes may call it at once: each builds its own copy and renames it into place.
    """
    digest = hashlib.sha256()
    for entry in ETC_ENTRIES:
        source = Path("/etc", entry)
        for path in sorted([source, *source.rglob("*")] if source.is_dir() and not source.is_symlink() else [source]):
            if path.is_symlink():
                digest.update(f"{path}>{os.readlink(path)}".encode())
            elif path.is_file():
                digest.update(str(path).encode() + path.read_bytes())
    target = destination / f"etc-{digest.hexdigest()[:16]}"
    destination.mkdir(parents=True, exist_ok=True)
    destination.chmod(0o711)  # sandboxes' own uids pass through it (a process's umask may be 077)
    if target.is_dir():
        return target
    building = Path(tempfile.mkdtemp(prefix=".etc-", dir=destination))
    for entry in ETC_ENTRIES:
        source = Path("/etc", entry)
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, building / entry, symlinks=True)
        elif source.is_symlink() or source.is_file():
            shutil.copy2(source, building / entry, follow_symlinks=False)
    building.chmod(0o755)
    try:
        building.rename(target)
    except OSError:  # another process put its copy there first
        shutil.rmtree(building, ignore_errors=True)
    return target
