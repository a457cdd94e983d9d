"""A sandbox's writable root: its image under an overlay (overlayfs,
https://docs.kernel.org/filesystems/overlayfs.html) whose upper layer lives on the sandbox's own
disk, mounted by the agent (as root) in the sandbox's folder and bound as the sandbox's ``/``.

What a command writes anywhere outside the sandbox's kernel file systems (``/proc``, ``/dev``)
and its ``/workspace`` and ``/tmp`` lands in the upper layer: it counts against the sandbox's disk
(the tmpfs the upper layer is on), is gone with the sandbox, and no other sandbox sees it; the
image on the host is only ever read (its layer is a read-only mount).

The image's files belong to root on the host, a uid the sandbox's user namespace does not map:
left so, the sandbox (uid 1000 inside, one host uid outside) could add folders to ``/`` alone. So
the image's layer is an idmapped mount (mount_setattr(2) ``MOUNT_ATTR_IDMAP``) of the image that
shows its root-owned files as the sandbox's host uid, which is uid 1000 inside: the sandbox owns
its whole root, as a container's root user does. Where the image's file system cannot be
idmapped, the image's layer is the image itself and only what the sandbox creates is its own.

Bubblewrap 0.8 cannot mount an overlay (``--overlay`` came with 0.9), and only root may mount one
over an idmapped layer, so the agent mounts it before bwrap starts, with no host path in its
options (each layer is named ``/proc/self/fd/N``, which the sandbox's mountinfo shows).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import time
from pathlib import Path

#: mount(2), umount2(2), open_tree(2), move_mount(2) and mount_setattr(2) values (linux/mount.h;
#: the system call numbers are those of every architecture's common table since Linux 5.2).
MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 4
_MOUNT_ATTR_RDONLY = 1
_MOUNT_ATTR_IDMAP = 0x100000
#: How long the helper that holds a user namespace for an idmapping may take to enter it (seconds).
_USERNS_TIMEOUT_S = 5.0


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def libc() -> ctypes.CDLL:
    """Return the C library with errno kept (for ``ctypes.get_errno``)."""
    return ctypes.CDLL(None, use_errno=True)


def unmount(path: Path) -> None:
    """Detach the mount at ``path`` if there is one (lazily: open files keep it until closed)."""
    if os.path.ismount(path):
        libc().umount2(os.fsencode(path), MNT_DETACH)


def mount(image: Path, *, target: Path, upper: Path, work: Path, uid: int, idmaps: dict[int, int]) -> bool:
    """Mount ``image`` under an overlay at ``target`` (an empty folder) with ``upper`` and ``work``
    (empty folders on the sandbox's disk) as its upper and work directories, the image's files
    shown as host uid ``uid`` (an idmapped layer) where the image's file system allows it.
    ``idmaps`` keeps, per uid, a descriptor of the user namespace that maps root to it (reused by
    the next sandbox of that uid). ``upper`` is made the sandbox's (its owner is the owner of the
    sandbox's ``/``). Return whether the overlay is mounted; False leaves nothing mounted."""
    os.chown(upper, uid, uid)
    lower = target.parent / f".{target.name}-image"
    lower.mkdir(mode=0o700, exist_ok=True)
    try:
        idmapped = _attach_idmapped(image, lower, _userns(uid, idmaps))
        fds = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
               for path in (lower if idmapped else image, upper, work)]
        try:
            options = "lowerdir=/proc/self/fd/{},upperdir=/proc/self/fd/{},workdir=/proc/self/fd/{}".format(*fds)
            mounted = libc().mount(b"overlay", os.fsencode(target), b"overlay", MS_NOSUID | MS_NODEV, options.encode()) == 0
        finally:
            for fd in fds:
                os.close(fd)
    finally:
        # The overlay holds its own clone of the layer. Not ``unmount``: an idmapped copy of a
        # folder on the file system that holds ``lower`` is not a mount os.path.ismount sees.
        libc().umount2(os.fsencode(lower), MNT_DETACH)
        with contextlib.suppress(OSError):
            lower.rmdir()
    return mounted


def _userns(uid: int, idmaps: dict[int, int]) -> int | None:
    """Return a descriptor of a user namespace mapping uid and gid 0 to host ``uid`` (kept in
    ``idmaps``), or None when one cannot be made. A helper (util-linux ``unshare``) enters a new
    user namespace, Lab writes its maps, keeps a descriptor of it and lets the helper end."""
    if uid in idmaps:
        return idmaps[uid]
    try:
        helper = subprocess.Popen(["unshare", "--user", "cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    except OSError:
        return None
    try:
        ours = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + _USERNS_TIMEOUT_S
        while os.readlink(f"/proc/{helper.pid}/ns/user") == ours:
            if time.monotonic() > deadline or helper.poll() is not None:
                return None
            time.sleep(0.001)
        Path(f"/proc/{helper.pid}/uid_map").write_text(f"0 {uid} 1\n")
        Path(f"/proc/{helper.pid}/setgroups").write_text("deny")
        Path(f"/proc/{helper.pid}/gid_map").write_text(f"0 {uid} 1\n")
        idmaps[uid] = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        return idmaps[uid]
    except OSError:
        return None
    finally:
        helper.stdin.close()
        helper.kill()
        helper.wait()


def _attach_idmapped(image: Path, lower: Path, userns_fd: int | None) -> bool:
    """Attach a read-only copy of the mount of ``image`` at ``lower``, its owners mapped through
    ``userns_fd``; return False (nothing attached) where the kernel or the file system refuses."""
    if userns_fd is None:
        return False
    call = libc().syscall
    call.restype = ctypes.c_long
    tree = call(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(image), _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE)
    if tree < 0:
        return False
    try:
        attributes = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns_fd)
        if call(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attributes), ctypes.sizeof(attributes)) < 0:
            return False
        return call(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, os.fsencode(lower), _MOVE_MOUNT_F_EMPTY_PATH) == 0
    finally:
        os.close(tree)
