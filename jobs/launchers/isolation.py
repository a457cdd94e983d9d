"""The local launcher's sandbox: each engine attempt runs in bubblewrap namespaces of its own.

Environment code is hostile (docs/local-launcher.md "Isolation"): a pushed package runs inside the
engine's processes, so the engine runs where it can reach nothing of Lab's and nothing of another
job's. ``bubblewrap_command`` wraps the engine's command line in ``bwrap`` with

- its own PID namespace (no other process is visible, none can be signalled or traced), IPC, UTS
  and cgroup namespaces, a user namespace of its own (uid and gid 1000, every capability dropped,
  no nested user namespaces);
- its own network namespace: only its own loopback. Lab's ingest URL (and the object store, when
  checkpoints live in one) is reached through Unix sockets the supervisor relays
  (``jobs.launchers.supervise``, ``engine.egress``), so neither the database, Redis nor anything
  else on the host's network is reachable; the judges a job declares are served on that loopback
  at their own addresses (``engine.egress.serve_forwards``), each through its relay, their host
  names in the sandbox's own ``/etc/hosts``;
- its own mount namespace over an empty root: the system's programs and libraries read-only
  (``/usr`` and the ``/etc`` files a program needs, not the rest of ``/etc``), the Python
  installation and the engine's code (``engine/``, ``sdk/``, ``.venv-verifiers``; not the rest of
  the repository) read-only with ``LAB_DATA_DIR`` hidden, the model cache read-only, its
  own work dir and its job's storage folder writable (its own checkpoint uploads; Lab re-hashes
  what it stores), each of its job's package wheels read-only, and fresh ``/tmp``, ``/dev`` and
  ``/proc``.

``bubblewrap`` (https://github.com/containers/bubblewrap) is Debian's package of that name.
"""

from __future__ import annotations

import functools
import ipaddress
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from lab.lib.bubblewrap import SANDBOX_UID, SYSTEM_DIRS, base_arguments

#: ``LAB_LOCAL_ISOLATION`` values: a sandbox per attempt (default), or none (unsafe: environment
#: code then runs as Lab's own user, beside Lab's processes and files).
ISOLATION_BUBBLEWRAP = "bubblewrap"
ISOLATION_NONE = "none"
ISOLATION_CHOICES = (ISOLATION_BUBBLEWRAP, ISOLATION_NONE)

#: Where the egress sockets appear inside the sandbox (short: a socket address holds 108 bytes).
EGRESS_DIR = "/run/lab/egress"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces on this machine."""


@dataclass(frozen=True)
class SandboxLayout:
    """What one attempt's sandbox sees: paths keep their host names inside.

    ``hidden`` folders are replaced by empty ones (``LAB_DATA_DIR`` under a visible folder);
    ``egress`` names the supervisor's sockets (``name -> origin``) under ``workdir/egress``;
    ``hosts`` (host name -> loopback address: the judges the engine serves on its loopback) makes
    the sandbox's ``/etc/hosts`` (``hosts_text``, written to ``workdir/hosts`` by the launcher).
    """

    workdir: Path
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    environment: Mapping[str, str] = field(default_factory=dict)
    hosts: Mapping[str, str] = field(default_factory=dict)


def hosts_text(hosts: Mapping[str, str]) -> str:
    """Return an ``/etc/hosts`` with the loopback names and ``hosts`` (name -> address)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    return "\n".join([*lines, *(f"{address}\t{name}" for name, address in sorted(hosts.items()))]) + "\n"


def loopback_hosts(urls: list[str]) -> dict[str, str]:
    """Return a loopback address of its own (``127.77.0.N``) for each judge host named by a host
    name other than ``localhost``: the sandbox's ``/etc/hosts`` says so, and the engine listens
    there for it (``engine.egress.serve_forwards``). An address needs no entry."""
    hosts: dict[str, str] = {}
    for url in urls:
        host = httpx.URL(url).host
        if host == "localhost" or host in hosts or _is_address(host):
            continue
        hosts[host] = f"127.77.0.{len(hosts) + 1}"
    return hosts


def _is_address(host: str) -> bool:
    """Whether ``host`` is an IP address rather than a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def bubblewrap_command(layout: SandboxLayout, command: list[str], *, bwrap: str = "bwrap") -> list[str]:
    """Return ``command`` wrapped in ``bwrap`` with ``layout`` (see the module's docstring).

    Order matters to bwrap: later mounts lie over earlier ones, so the hidden folders come after
    what holds them and the writable ones last.
    """
    args = base_arguments(hostname="lab-engine", bwrap=bwrap)
    for path in _outermost(layout.read_only):
        args += ["--ro-bind", str(path), str(path)]
    for path in layout.hidden:
        args += ["--tmpfs", str(path)]
    for path in layout.read_only:
        if any(hidden in path.parents or hidden == path for hidden in layout.hidden):
            args += ["--ro-bind", str(path), str(path)]  # shown again inside a hidden folder
    for path in (*layout.writable, layout.workdir):
        args += ["--bind", str(path), str(path)]
    args += ["--ro-bind", str(layout.workdir / "egress"), EGRESS_DIR]
    if layout.hosts:
        args += ["--ro-bind", str(layout.workdir / "hosts"), "/etc/hosts"]
    for name, value in sorted(layout.environment.items()):
        args += ["--setenv", name, value]
    args += ["--chdir", str(layout.workdir), "--", *command]
    return args


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """Return ``paths`` without those inside another of them, in a stable order."""
    unique = sorted(set(paths))
    return [path for path in unique if not any(other in path.parents for other in unique if other != path)]


def python_paths() -> tuple[Path, ...]:
    """Return the folders the worker's Python needs: its installation and its virtual environment."""
    return tuple(Path(prefix).resolve() for prefix in {sys.base_prefix, sys.prefix, sys.exec_prefix})


@functools.cache
def check_bubblewrap(bwrap: str = "bwrap") -> str:
    """Return the path of ``bwrap`` once it has been seen to create a sandbox here; raise
    SandboxUnavailable saying what to do otherwise (cached per process)."""
    path = shutil.which(bwrap)
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: the local launcher runs environment code in a sandbox. "
            "Install it (Debian/Ubuntu: apt-get install bubblewrap), or set LAB_LOCAL_ISOLATION=none on a "
            "machine where every environment is trusted."
        )
    probe = [path, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    for directory in SYSTEM_DIRS:
        probe += ["--ro-bind-try", directory, directory]
    try:
        result = subprocess.run([*probe, "--", "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SandboxUnavailable(f"bubblewrap could not start a sandbox: {error}") from None
    if result.returncode != 0:
        raise SandboxUnavailable(
            "bubblewrap could not start a sandbox (are unprivileged user namespaces allowed?): "
            + result.stderr.decode(errors="replace").strip()[-300:]
        )
    return path
