"""A memory cgroup per sandbox, so that a sandbox that uses more memory than it has gets its
processes killed by the kernel's OOM killer inside that sandbox alone (docs/sandboxes.md
"Isolation").

The cgroups live under the agent's own memory cgroup (``<its cgroup>/lab-sandboxes-<agent
pid>/<name>``), in the cgroup v1 memory hierarchy (``memory.limit_in_bytes``, the OOM kills
counted in ``memory.oom_control``) or, where the agent's cgroup v2 can hold children with the
memory controller, in v2 (``memory.max``, ``memory.events``). ``MemoryCgroups.detect`` returns
None where neither works (no cgroup file system writable by the agent): sandboxes then fall back
to an address-space limit (setrlimit), under which an allocation fails instead of being killed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

V1_MEMORY = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


class MemoryCgroups:
    """The memory cgroups of one agent's sandboxes under ``parent`` (``version`` 1 or 2)."""

    def __init__(self, parent: Path, *, version: int) -> None:
        self.parent = parent
        self.version = version

    @classmethod
    def detect(cls) -> MemoryCgroups | None:
        """Return this process's sandbox cgroups (their parent made), or None when it cannot make them."""
        for version, base in _own_memory_cgroups():
            parent = base / f"lab-sandboxes-{os.getpid()}"
            try:
                parent.mkdir(exist_ok=True)
                if version == 2:
                    (parent / "cgroup.subtree_control").write_text("+memory")
                probe = cls(parent, version=version)
                probe.create("probe", 64 * 1024 * 1024)
                probe.remove("probe")
                return probe
            except OSError:
                continue
        return None

    def path(self, name: str) -> Path:
        return self.parent / name

    def procs(self, name: str) -> Path:
        """Return the file a process writes its pid to in order to join cgroup ``name``."""
        return self.path(name) / "cgroup.procs"

    def create(self, name: str, limit_bytes: int) -> None:
        """Make cgroup ``name`` holding at most ``limit_bytes`` of memory, swap included (idempotent)."""
        self.path(name).mkdir(exist_ok=True)
        self.set_limit(name, limit_bytes)

    def set_limit(self, name: str, limit_bytes: int) -> None:
        """Set cgroup ``name``'s memory limit (bytes; lowering it reclaims, then kills)."""
        path = self.path(name)
        if self.version == 2:
            (path / "memory.max").write_text(str(limit_bytes))
            _write_if_present(path / "memory.swap.max", "0")
            return
        # memory+swap may never be below memory alone: raise it first, or lower it last.
        swap = path / "memory.memsw.limit_in_bytes"
        current = int((path / "memory.limit_in_bytes").read_text())
        if limit_bytes > current:
            _write_if_present(swap, str(limit_bytes))
        (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        _write_if_present(swap, str(limit_bytes))

    def oom_kills(self, name: str) -> int:
        """Return how many processes the OOM killer has killed in cgroup ``name``."""
        source = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path(name) / source).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self, name: str, *, within_s: float = 2.0) -> None:
        """Remove cgroup ``name`` once its processes are gone (waits up to ``within_s`` seconds)."""
        deadline = time.monotonic() + within_s
        while True:
            try:
                self.path(name).rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.02)

    def close(self) -> None:
        """Remove the parent cgroup (its sandboxes' cgroups removed first)."""
        for child in self.parent.iterdir() if self.parent.is_dir() else ():
            if child.is_dir():
                self.remove(child.name)
        try:
            self.parent.rmdir()
        except OSError:
            pass


def _own_memory_cgroups() -> list[tuple[int, Path]]:
    """Return the places this process's memory cgroup is, v1 first."""
    found = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            found.append((1, V1_MEMORY / path.lstrip("/")))
        elif controllers == "" and "memory" in _read(V2_ROOT / "cgroup.controllers").split():
            found.append((2, V2_ROOT / path.lstrip("/")))
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write_if_present(path: Path, value: str) -> None:
    """Write ``value`` to a cgroup file that a kernel may lack (swap accounting off)."""
    try:
        path.write_text(value)
    except OSError:
        pass
