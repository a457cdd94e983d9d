"""A sandbox allowed egress (lab/lib/egress.py, docs/sandboxes.md "Network"): it reaches
the internet through slirp4netns, and nothing of the host: not its loopback (PostgreSQL, Redis,
the agent), not its own addresses, not private or metadata addresses. Attacked from inside; each
target is first shown to answer on the host, so that the test fails if the protection goes."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from lab.lib import egress
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import CommandRequest, SandboxSpec

CONNECT = """
import json, socket, sys
results = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        results[f"{host}:{port}"] = "connected"
    except OSError as error:
        results[f"{host}:{port}"] = type(error).__name__
    s.close()
print(json.dumps(results))
"""


def _reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def listener():
    """A server on the host's first non-loopback address: the host's own services on its network."""
    addresses = [address for address in egress.host_addresses() if not address.startswith("127.")]
    if not addresses:
        pytest.skip("this host has no address but loopback")
    server = socket.create_server((addresses[0], 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[:2]
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def sandbox(runtime: AgentRuntime) -> SandboxSpec:
    spec = SandboxSpec(sandbox_id="sbx_egress", image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05,
                       network="egress", expires_at=time.time() + 600)
    runtime.start(spec)
    yield spec
    runtime.destroy(spec)


def connect(runtime: AgentRuntime, spec: SandboxSpec, targets: list[tuple[str, int]]) -> dict[str, str]:
    result = runtime.run(spec, CommandRequest(argv=("python3", "-c", CONNECT, json.dumps(targets)), timeout_s=60))
    assert result.exit_code == 0, result
    return json.loads(result.stdout)


def test_a_sandbox_allowed_egress_reaches_nothing_of_the_host(runtime, sandbox, listener, agent):
    agent_port = int(agent.url.rsplit(":", 1)[1])
    host_targets = [("127.0.0.1", 5432), ("127.0.0.1", 6379), ("127.0.0.1", agent_port), listener]
    for target in host_targets:
        assert _reachable(*target), f"the host should answer on {target}"
    # slirp4netns's gateway is the host's loopback unless --disable-host-loopback; the rest are
    # private, shared, metadata and this-network addresses, and the host's loopback by IPv6.
    targets = [*host_targets, ("10.0.2.2", 5432), ("10.0.2.2", agent_port), ("169.254.169.254", 80),
               ("10.255.255.53", 53), ("192.168.0.1", 80), ("172.17.0.1", 80), ("100.64.0.1", 80), ("0.0.0.0", 5432),
               ("::1", 5432)]
    answers = connect(runtime, sandbox, targets)
    assert answers == {f"{host}:{port}": "ConnectionRefusedError" for host, port in targets[:-1]} | {"::1:5432": answers["::1:5432"]}
    assert answers["::1:5432"] in ("ConnectionRefusedError", "OSError"), answers  # no IPv6 but its own loopback


def test_a_sandbox_allowed_egress_reaches_the_internet_and_resolves_names(runtime, sandbox):
    if not _reachable("1.1.1.1", 53):
        pytest.skip("this host does not reach the internet (1.1.1.1:53)")
    assert connect(runtime, sandbox, [("1.1.1.1", 53)]) == {"1.1.1.1:53": "connected"}
    try:
        socket.getaddrinfo("deb.debian.org", 80)
    except OSError:
        pytest.skip("this host resolves no names")
    code = "import socket; print(socket.getaddrinfo('deb.debian.org', 80, type=socket.SOCK_STREAM)[0][4][0])"
    result = runtime.run(sandbox, CommandRequest(argv=("python3", "-c", code), timeout_s=30))
    assert result.exit_code == 0 and result.stdout.strip(), result


def test_slirp4netns_runs_as_the_sandboxs_uid_and_ends_with_it(runtime, agent):
    spec = SandboxSpec(sandbox_id="sbx_egress_end", image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05,
                       network="egress", expires_at=time.time() + 600)
    runtime.start(spec)
    uid = runtime.host_uid(spec)
    try:
        found = _slirps()
        assert uid is not None and uid in found.values(), (uid, found)
    finally:
        runtime.destroy(spec)
    deadline = time.monotonic() + 3
    while uid in _slirps().values() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uid not in _slirps().values()


def _slirps() -> dict[int, int]:
    """Return the host's slirp4netns processes: pid to uid."""
    found = {}
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and Path(f"/proc/{entry.name}/comm").read_text().strip() == "slirp4netns":
                found[int(entry.name)] = entry.stat().st_uid
        except OSError:
            continue
    return found
