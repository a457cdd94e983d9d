"""Paths of files inside a sandbox as the agent's file routes and commands name them: which
area a path is in (``/workspace``, ``/tmp``, both bound on their own, or the rest of the
sandbox's root) and its components there, every path with ``..``, a NUL, or through a folder the
sandbox mounts on its own refused (``RuntimeRefusal`` ``invalid_path``). The host side of each
area is ``sandboxes.runtime.local``'s.
"""

from __future__ import annotations

import os

from sandboxes.runtime.base import WORKSPACE, RuntimeRefusal

#: The folders of a sandbox bound on its own (inside path, host subfolder of its ``disk``); files
#: elsewhere are in its root (``ROOT``).
AREAS = {WORKSPACE: "workspace", "/tmp": "tmp"}
#: The area of a path in the sandbox's writable root (``rootfs``), outside its ``AREAS``.
ROOT = "/"
#: The folders of ``/`` that are mounts of their own inside the sandbox (kernel file systems and
#: ``AREAS``): a file of the root is never moved in or out through them.
MOUNT_POINTS = frozenset({"proc", "dev", "tmp", "workspace"})


def sandbox_parts(path: str) -> tuple[str, list[str]]:
    """Return the area (``/workspace``, ``/tmp`` or the root, ``ROOT``) and the components below
    it of ``path`` (an absolute path, or one relative to /workspace); raise RuntimeRefusal
    ``invalid_path``, saying which, for a path with ``..`` or a NUL, one that names a folder of its
    own (``/``, ``/workspace``, ``/tmp``) and one through ``/proc`` or ``/dev``."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
        raise RuntimeRefusal("invalid_path", "path must name a file: an absolute path, or one relative to /workspace.")
    parts = [part for part in (path if path.startswith("/") else f"{WORKSPACE}/{path}").split("/") if part not in ("", ".")]
    if ".." in parts:
        raise RuntimeRefusal("invalid_path", "path must not contain '..'.")
    if len(parts) < 2 and (not parts or parts[0] in MOUNT_POINTS):
        raise RuntimeRefusal("invalid_path", f"{'/' + '/'.join(parts)} is a folder: name a file in it.")
    for area in AREAS:
        if parts[0] == area.lstrip("/"):
            return area, parts[1:]
    if parts[0] in MOUNT_POINTS:
        raise RuntimeRefusal("invalid_path", f"path must not be in /{parts[0]}, the sandbox's own kernel file system.")
    return ROOT, parts


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


def command_directory(cwd: str) -> str:
    """Return the working directory inside the sandbox for ``cwd``: the workspace when empty, a
    relative path below it, or any absolute path (it is resolved inside the sandbox, which sees
    nothing of the host). Raises RuntimeRefusal ``invalid_path`` for a NUL or an overlong path."""
    if not isinstance(cwd, str) or "\x00" in cwd or len(cwd) > 4096:
        raise RuntimeRefusal("invalid_path", "cwd must be a path.")
    if cwd in ("", ".", WORKSPACE, WORKSPACE + "/"):
        return WORKSPACE
    if cwd.startswith("/"):
        return os.path.normpath(cwd)
    return WORKSPACE + "/" + "/".join(workspace_parts(cwd))
