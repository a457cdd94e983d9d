"""Outbound network for a sandbox whose policy is ``egress`` (docs/sandboxes.md "Network"), and
for an environment build's steps that reach the package index or the Hugging Face Hub
(``environments.builder.network``).

Every sandbox has a network namespace of its own. One allowed egress gets, once its supervisor
answers and before any command runs:

1. a firewall in its namespace (``nft``, Debian's ``nftables``, run by the agent as root through
   ``nsenter``): what it sends to loopback stays on its own loopback; DNS to slirp4netns's
   forwarder (10.0.2.3:53) passes; every other packet to the host's own addresses (each address of
   each interface, read when the sandbox starts), loopback, private (RFC 1918), shared (100.64/10),
   link-local and metadata (169.254/16), "this network" (0/8), multicast and reserved ranges,
   slirp4netns's gateway (10.0.2.2) and any IPv6 address is rejected (ECONNREFUSED at once);
2. ``slirp4netns`` (Debian's package of that name) with ``--disable-host-loopback``: a tap device
   in the namespace (10.0.2.100/24, default route through 10.0.2.2) whose packets it turns into
   sockets of its own on the host, run as the sandbox's host uid, joined to the namespace through
   the user namespace that owns it (bubblewrap nests a second one below for ``--disable-userns``),
   with its seccomp filter; it ends with the sandbox.

A build step may also be given endpoints (``allow``: an address and port each) that pass the
firewall although their range is refused, a package index mirror on a private address; one on
the host's loopback is reached at slirp4netns's gateway (10.0.2.2, ``host_loopback``), that one
port only.

The sandbox's processes have no capability in that namespace (bubblewrap drops them all, and no
new user namespace may be made), so they cannot change its firewall or its routes.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import select
import shutil
import subprocess
import tempfile
from pathlib import Path

#: slirp4netns's addresses inside the sandbox (its defaults).
GATEWAY = "10.0.2.2"
DNS = "10.0.2.3"
#: What a sandbox allowed egress may never reach, besides the host's own addresses.
BLOCKED_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/3",
)
#: ioctl(2) NS_GET_USERNS (linux/nsfs.h): the user namespace that owns a namespace.
_NS_GET_USERNS = 0xB701
#: How long slirp4netns may take to say its tap device is up (seconds).
READY_TIMEOUT_S = 5.0


def tool(name: str) -> str | None:
    """Return the path of the program ``name`` on ``PATH`` or in the system's sbin and bin folders
    (a caller's ``PATH`` may leave /usr/sbin out, where Debian puts ``nft``), None without it."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"]))


class EgressUnavailable(Exception):
    """The sandbox's outbound network could not be set up (a tool missing, not root, a failure)."""


def host_addresses() -> list[str]:
    """Return every IPv4 address of the host's interfaces (``ip -j address``)."""
    try:
        answer = subprocess.run([tool("ip") or "ip", "-j", "address"], capture_output=True, text=True, check=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise EgressUnavailable(f"the host's addresses could not be read: {error}") from None
    found = []
    for interface in json.loads(answer or "[]"):
        for address in interface.get("addr_info", []):
            if address.get("family") == "inet" and address.get("local"):
                found.append(str(ipaddress.ip_address(address["local"])))
    return sorted(set(found))


def ruleset(host: list[str], allow: tuple[tuple[str, int], ...] = ()) -> str:
    """Return the nft ruleset of a sandbox allowed egress whose host has the addresses ``host``;
    ``allow``: (IPv4 address, TCP port) pairs accepted before any refusal."""
    blocked = ", ".join([*BLOCKED_V4, GATEWAY, *host])
    accepted = "".join(f"    ip daddr {ipaddress.IPv4Address(address)} tcp dport {int(port)} accept\n" for address, port in allow)
    return f"""table inet lab_egress {{
  chain output {{
    type filter hook output priority 0; policy accept;
    oifname "lo" accept
    ip daddr {DNS} udp dport 53 accept
    ip daddr {DNS} tcp dport 53 accept
{accepted}    meta l4proto tcp ip daddr {{ {blocked} }} reject with tcp reset
    ip daddr {{ {blocked} }} reject with icmpx type admin-prohibited
    meta nfproto ipv6 reject with icmpx type admin-prohibited
  }}
}}
"""


def namespace_pid(bwrap_pid: int) -> int:
    """Return the pid (on the host) of the sandbox's first process inside its namespaces: bwrap's child."""
    try:
        children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    except OSError:
        children = []
    if not children:
        raise EgressUnavailable("the sandbox's namespaces are gone")
    return int(children[0])


def start(
    bwrap_pid: int, *, uid: int | None, allow: tuple[tuple[str, int], ...] = (), host_loopback: bool = False,
) -> tuple[subprocess.Popen, int]:
    """Firewall the network namespace of the sandbox whose bwrap is ``bwrap_pid`` (``ruleset``,
    with ``allow``), then start its slirp4netns (as host ``uid``; Lab's own user when None; the
    gateway 10.0.2.2 the host's loopback when ``host_loopback``, which only ``allow``'s gateway
    ports reach) and wait until its tap device is up.
    Return the slirp4netns process and a descriptor whose closing ends it (``--exit-fd``: it ends
    with the agent too); the caller kills it and closes that when the sandbox stops.
    EgressUnavailable when any step fails, having started nothing that outlives it."""
    if os.geteuid() != 0:
        raise EgressUnavailable("a sandbox's outbound network needs the sandbox agent to run as root")
    pid = namespace_pid(bwrap_pid)
    firewall = subprocess.run([tool("nsenter") or "nsenter", f"--net=/proc/{pid}/ns/net", tool("nft") or "nft", "-f", "-"], input=ruleset(host_addresses(), allow),
                              capture_output=True, text=True, timeout=10)
    if firewall.returncode != 0:
        raise EgressUnavailable(f"its firewall could not be set (nft): {firewall.stderr.strip()[:300]}")
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    ready_read, ready_write = os.pipe()
    exit_read, exit_write = os.pipe()
    os.set_inheritable(exit_write, False)
    errors = tempfile.TemporaryFile()
    try:
        owner = fcntl.ioctl(net, _NS_GET_USERNS)
        identity = [tool("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] if uid is not None else []
        loopback = [] if host_loopback else ["--disable-host-loopback"]
        command = [*identity, tool("slirp4netns") or "slirp4netns", "--configure", "--mtu=65520", *loopback, "--enable-seccomp",
                   f"--userns-path=/proc/self/fd/{owner}", "--netns-type=path", f"--ready-fd={ready_write}",
                   f"--exit-fd={exit_read}", f"/proc/self/fd/{net}", "tap0"]
        try:
            process = subprocess.Popen(command, pass_fds=[owner, net, ready_write, exit_read], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
        except OSError as error:
            os.close(exit_write)
            raise EgressUnavailable(f"slirp4netns could not start: {error}") from None
        finally:
            for fd in (owner, ready_write, exit_read):
                os.close(fd)
        if _read_ready(ready_read) != b"1":
            process.kill()
            process.wait()
            os.close(exit_write)
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip()
            raise EgressUnavailable(f"slirp4netns did not start: {said[-300:] or 'no answer'}")
        return process, exit_write
    finally:
        errors.close()
        os.close(net)
        os.close(ready_read)


def _read_ready(fd: int) -> bytes:
    """Return what slirp4netns wrote on its ready descriptor within READY_TIMEOUT_S (b'' if nothing)."""
    readable, _, _ = select.select([fd], [], [], READY_TIMEOUT_S)
    return os.read(fd, 1) if readable else b""
