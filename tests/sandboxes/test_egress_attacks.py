"""A sandbox allowed egress attacked from inside (lab/lib/egress.py, sandboxes/runtime/local.py):
by UDP as well as TCP, at slirp4netns's host and DNS addresses past port 53, at the host's own
addresses, by raw and packet sockets, by changing its own network (its interface, routes, a new
user namespace), and through the image's setuid programs. Each must fail."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest

from lab.lib import egress
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import CommandRequest, SandboxSpec

PROBE = r"""
import ctypes, errno, fcntl, json, os, socket, struct, subprocess, sys
out = {}
def attempt(name, fn):
    try:
        out[name] = "ok:" + str(fn())
    except OSError as error:
        out[name] = errno.errorcode.get(error.errno, str(error.errno)) if error.errno else type(error).__name__
    except Exception as error:
        out[name] = type(error).__name__
targets = json.loads(sys.argv[1])
for host, port in targets:
    def udp(host=host, port=port):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
        s.connect((host, port)); s.send(b"x"); return s.recv(10)
    attempt(f"udp {host}:{port}", udp)
    def tcp(host=host, port=port):
        s = socket.create_connection((host, port), timeout=3); s.close(); return "connected"
    attempt(f"tcp {host}:{port}", tcp)
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("ping", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
def tap_down():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    request = struct.pack("16sH14x", b"tap0", 0)
    return fcntl.ioctl(s, 0x8914, request)  # SIOCSIFFLAGS: no flags, the interface down
attempt("tap0 down", tap_down)
def route_add():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sin = lambda a: struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton(a))
    rt = struct.pack("L", 0) + sin("192.0.2.0") + sin("10.0.2.2") + sin("255.255.255.0") + struct.pack("H", 3) + b"\0" * 64
    return fcntl.ioctl(s, 0x890B, rt)  # SIOCADDRT
attempt("route add", route_add)
def netfilter():
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
    # NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_DELTABLE of table inet lab_egress
    name = b"lab_egress\0"; attr = struct.pack("HH", 4 + len(name), 1) + name + b"\0" * (-len(name) % 4)
    body = struct.pack("BBH", 1, 0, 0) + attr
    s.sendto(struct.pack("IHHII", 16 + len(body), (10 << 8) | 2, 0x5, 1, 0) + body, (0, 0))
    reply = s.recv(4096); code = struct.unpack("i", reply[16:20])[0]
    if code: raise OSError(-code, "netlink")
    return "deleted"
attempt("nft delete table", netfilter)
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flag):
    if libc.unshare(flag) != 0: raise OSError(ctypes.get_errno(), "unshare")
    return "unshared"
attempt("unshare user", lambda: unshare(0x10000000))
attempt("unshare net", lambda: unshare(0x40000000))
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
out["CapEff"], out["CapBnd"], out["NoNewPrivs"] = status["CapEff"].strip(), status["CapBnd"].strip(), status["NoNewPrivs"].strip()
for program in ("/usr/bin/su", "/usr/bin/newgrp"):
    if os.path.exists(program):
        ran = subprocess.run([program, "-c", "id -u"] if program.endswith("su") else [program, "root"], input="",
                             capture_output=True, text=True, timeout=5)
        out[program] = f"exit {ran.returncode}: {(ran.stdout + ran.stderr).strip()[:200]}"
print(json.dumps(out))
"""


def _host_v6() -> list[str]:
    """The host's global IPv6 addresses (``ip -j address``)."""
    listed = json.loads(subprocess.run(["ip", "-j", "address"], capture_output=True, text=True, check=True).stdout)
    return [item["local"] for interface in listed for item in interface.get("addr_info", [])
            if item.get("family") == "inet6" and item.get("scope") == "global"]


@pytest.fixture
def sandbox(runtime: AgentRuntime) -> SandboxSpec:
    spec = SandboxSpec(sandbox_id="sbx_egress_attack", image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05,
                       network="egress", expires_at=time.time() + 600)
    runtime.start(spec)
    yield spec
    runtime.destroy(spec)


def test_a_sandbox_allowed_egress_cannot_reach_the_host_by_udp_nor_change_its_network_nor_gain_privilege(runtime, sandbox):
    host = [address for address in egress.host_addresses() if not address.startswith("127.")]
    resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a UDP echo service on the host's own address
    resolver.bind((host[0] if host else "127.0.0.1", 0))
    resolver.settimeout(0.2)
    stop = threading.Event()

    def echo():
        while not stop.is_set():
            try:
                data, sender = resolver.recvfrom(100)
                resolver.sendto(data, sender)
            except OSError:
                continue

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.settimeout(2)
    probe.sendto(b"x", resolver.getsockname())
    assert probe.recv(10) == b"x"  # it answers on the host
    probe.close()
    targets = [("10.0.2.2", 53), ("10.0.2.2", 5432), ("10.0.2.3", 5432), ("10.0.2.3", 6379), ("10.0.2.3", 22),
               resolver.getsockname()[:2], ("127.0.0.1", 6379)]
    targets += [(address, 22) for address in _host_v6()]  # the host's own IPv6 addresses (fd00::2 on eth0 here)
    result = runtime.run(sandbox, CommandRequest(argv=("python3", "-c", PROBE, json.dumps(targets)), timeout_s=90))
    stop.set()
    thread.join()
    resolver.close()
    assert result.exit_code == 0, result
    answers = json.loads(result.stdout)
    reached = {name: answer for name, answer in answers.items() if answer.startswith("ok:")}
    assert not reached, answers
    assert all(not answers[program].startswith("exit 0") for program in ("/usr/bin/su", "/usr/bin/newgrp") if program in answers), answers
    assert (answers["CapEff"], answers["CapBnd"], answers["NoNewPrivs"]) == ("0000000000000000", "0000000000000000", "1"), answers
