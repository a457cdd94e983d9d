"""The network of a build step that runs a package's code and must reach an endpoint: building a
source archive (its build backend comes from the package index) and loading the environment
(the Hugging Face Hub datasets it asks for).

Such a step runs in bubblewrap (``sandbox.sandbox_command``) with a network namespace of its own,
never the host's: before the step's command starts (bwrap waits on ``--block-fd``), the namespace
gets ``lab.lib.egress``'s firewall and slirp4netns, so the package's code reaches public
addresses and the step's own ``endpoints``, and nothing else of the host: not Lab's PostgreSQL,
Redis or web port on its loopback, not a private or metadata address. An endpoint on a private
address passes the firewall (that address and port only); one on the host's loopback (a local
package index or Hub, as in development and the tests) is reached at slirp4netns's gateway,
10.0.2.2, and its URL is rewritten so (``Reach.urls``).

That needs the builder to run as root, with slirp4netns and nft installed (``make install``):
``available`` says why not otherwise, and the builder then runs the step without a network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from environments.builder.sandbox import sandbox_command
from environments.builder.steps import BuildFailed, BuildRequest, log, run_step
from lab.lib import egress

#: How names resolve in the step (its resolver is slirp4netns's forwarder, written in its own resolv.conf).
_NAME_FILES = ("/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf")


@dataclass(frozen=True)
class Reach:
    """What a step's namespace is let through to: ``allow`` (address, port) pairs its firewall
    accepts, ``host_loopback`` whether slirp4netns's gateway is the host's loopback (only the
    allowed gateway ports pass), ``urls`` each endpoint's URL as the step must call it."""

    allow: tuple[tuple[str, int], ...] = ()
    host_loopback: bool = False
    urls: dict[str, str] = field(default_factory=dict)


def available() -> str | None:
    """Return why a step cannot be given a network namespace here (None when it can)."""
    if os.geteuid() != 0:
        return "the builder does not run as root"
    missing = [name for name in ("slirp4netns", "nft", "nsenter", "ip") if egress.tool(name) is None]
    return f"{', '.join(missing)} not installed" if missing else None


def reach(urls: list[str]) -> Reach:
    """Return how a step reaches ``urls`` (http or https; another scheme, a ``file://`` index, needs
    nothing): a host on a private address gets that (address, port) allowed; one on the loopback
    gets the gateway's port allowed and its URL rewritten to ``10.0.2.2``; a public one passes as
    it is. A host that does not resolve is left to fail in the step."""
    allow: list[tuple[str, int]] = []
    rewritten: dict[str, str] = {}
    host_loopback = False
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(parts.hostname, port, socket.AF_INET, socket.SOCK_STREAM)}
        except OSError:
            continue
        for address in sorted(addresses):
            if ipaddress.IPv4Address(address).is_loopback:
                host_loopback = True
                allow.append((egress.GATEWAY, port))
                netloc = f"{egress.GATEWAY}:{port}" if parts.port else egress.GATEWAY
                rewritten[url] = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
            elif not ipaddress.IPv4Address(address).is_global:
                allow.append((address, port))
    return Reach(allow=tuple(dict.fromkeys(allow)), host_loopback=host_loopback, urls=rewritten)


def index_step(
    request: BuildRequest, command: Callable[[str], list[str]], *, environment: dict[str, str], cwd: Path, timeout: float,
    what: str, refuse: bool,
) -> subprocess.CompletedProcess:
    """Run the uv step ``command(index_url)``, which reaches the package index and may run a
    package's setup code (a source archive's build backend), as ``request`` says: in bubblewrap
    (``request.sandbox``) with the Pythons, uv and a ``file://`` index read-only and the build's
    folder writable, from a network namespace of its own that reaches an ``http(s)`` index
    (``run_in_namespace``; ``command`` is given the index's URL as the namespace reaches it). Where
    that namespace cannot be set up, ``refuse`` fails the build saying so (``what`` names the step);
    otherwise the step runs outside bubblewrap, as Lab's worker, saying so in the log."""
    index_url = request.index_url
    if not request.sandbox:
        return run_step(command(index_url), timeout=timeout, env=environment, cwd=cwd)
    readable = [Path(sys.base_prefix), Path(sys.prefix), Path(request.python).resolve().parent.parent, Path(request.uv).resolve().parent]
    frozen = request.workdir / "venv" if (request.workdir / "venv").exists() else None
    if index_url.startswith("file://"):
        readable.append(Path(urllib.parse.unquote(urllib.parse.urlsplit(index_url).path)).resolve().parent)
        sandbox = sandbox_command(readable, request.workdir, frozen=frozen, chdir=cwd)
        return run_step([*sandbox, *command(index_url)], timeout=timeout, env=environment, cwd=cwd)
    if (why := available()) is not None:
        if refuse:
            raise BuildFailed(
                f"{what} reaches the package index from a network namespace of its own, which cannot be set up here "
                f"({why}): run Lab's worker as root with slirp4netns and nftables (make install)"
            )
        log(f"{what} runs outside bubblewrap: a network namespace of its own cannot be set up here ({why})")
        return run_step(command(index_url), timeout=timeout, env=environment, cwd=cwd)
    proxies = {name: value for name, value in environment.items() if name.lower() in ("https_proxy", "http_proxy") and value}
    reach_ = reach([index_url, *proxies.values()])
    environment = {**environment, **{name: reach_.urls.get(value, value) for name, value in proxies.items()}}
    sandbox = sandbox_command(readable, request.workdir, frozen=frozen, chdir=cwd)
    return run_in_namespace(sandbox, command(reach_.urls.get(index_url, index_url)), reach_=reach_, timeout=timeout,
                            env=environment, cwd=cwd)


def run_in_namespace(
    sandbox: list[str], command: list[str], *, reach_: Reach, timeout: float, env: dict[str, str], cwd: Path,
) -> subprocess.CompletedProcess:
    """Run ``command`` under the bwrap prefix ``sandbox`` (made with no network: its own network
    namespace) once that namespace has the firewall and slirp4netns of ``reach_``; return the
    finished process, its output captured as text. BuildFailed when the namespace cannot be set up
    or the step outlives ``timeout`` (seconds)."""
    assert sandbox and sandbox[-1] == "--"
    info_read, info_write = os.pipe()
    block_read, block_write = os.pipe()
    with tempfile.NamedTemporaryFile("w", prefix="resolv-", suffix=".conf", delete=False) as resolv:
        resolv.write(f"nameserver {egress.DNS}\n")
    names = [option for path in _NAME_FILES for option in ("--ro-bind-try", path, path)]
    args = [*sandbox[:-1], "--info-fd", str(info_write), "--block-fd", str(block_read), *names,
            "--ro-bind", resolv.name, "/etc/resolv.conf", "--", *command]
    network = None
    try:
        process = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   pass_fds=(info_write, block_read), start_new_session=True)
        os.close(info_write)
        os.close(block_read)
        info_write = block_read = -1
        try:
            child = _child_pid(info_read)
            network = egress.start(_bwrap_pid(process.pid, child), uid=None, allow=reach_.allow, host_loopback=reach_.host_loopback)
        except (egress.EgressUnavailable, ValueError, KeyError, OSError) as error:
            _kill(process)
            raise BuildFailed(f"the step's network could not be set up: {error}") from None
        os.write(block_write, b"1")
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(process)
            raise BuildFailed(f"'{Path(command[0]).name}' took longer than {timeout:.0f} s") from None
        return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    finally:
        for fd in (info_read, info_write, block_read, block_write):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if network is not None:
            slirp, exit_fd = network
            os.close(exit_fd)
            slirp.kill()
            slirp.wait()
        os.unlink(resolv.name)


def _child_pid(info: int) -> int:
    """Return the pid of the sandbox's first process from bwrap's ``--info-fd`` JSON, written (in
    one or more pieces) once its namespaces exist; ValueError when bwrap ended without it."""
    said = b""
    while b"}" not in said:
        piece = os.read(info, 4096)
        if not piece:
            raise ValueError(f"bubblewrap ended before its namespaces were made ({said[:200]!r})")
        said += piece
    return int(json.loads(said[: said.index(b"}") + 1])["child-pid"])


def _kill(process: subprocess.Popen) -> None:
    """Kill the step's whole process group (bwrap, and the sandbox's processes with it) and reap it."""
    try:
        os.killpg(process.pid, 9)
    except ProcessLookupError:
        pass
    process.communicate()


def _bwrap_pid(started: int, child: int) -> int:
    """Return the pid of the bwrap whose first child is ``child`` (``lab.lib.egress.start`` takes
    bwrap's): the process started (the seccomp prefix execs bwrap in place) or, where bwrap forked
    once more for its user namespace, the parent of ``child``."""
    try:
        stat = Path(f"/proc/{child}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return started
