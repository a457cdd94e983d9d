"""Sandboxes attacked through what their commands leave in /workspace for the agent's file routes
(sandboxes/runtime/local.py): the agent opens those files itself, so nothing a command made may
hold its request or turn a write into anything but a regular file's. And a command calling the
kernel where Lab's seccomp filter (lab/lib/seccomp.py) refuses it."""

from __future__ import annotations

import json
import threading
import time

import pytest

from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import CommandRequest, RuntimeRefusal, SandboxSpec
from sandboxes.runtime.local import LocalHost


@pytest.fixture
def sandbox(runtime: AgentRuntime) -> SandboxSpec:
    spec = SandboxSpec(sandbox_id="sbx_attack", image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05,
                       expires_at=time.time() + 600)
    runtime.start(spec)
    yield spec
    runtime.destroy(spec)


def _within(seconds: float, function, *args):
    """Call ``function(*args)`` in a thread; return what it returned or raised, or fail when it
    has not ended within ``seconds`` (the thread is left blocked: a daemon)."""
    outcome: list = []

    def call():
        try:
            outcome.append(function(*args))
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcome.append(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{function.__name__} still blocked after {seconds} s"
    return outcome[0]


def test_an_upload_onto_a_fifo_a_command_left_is_refused_at_once(runtime, agent, sandbox):
    made = runtime.run(sandbox, CommandRequest(argv=("mkfifo", "trap"), timeout_s=10))
    assert made.exit_code == 0, made.stderr
    assert (LocalHost(agent.root).workdir(sandbox) / "trap").is_fifo()

    written = _within(5, runtime.write_file, sandbox, "trap", b"x")

    assert isinstance(written, RuntimeRefusal) and written.code == "invalid_path", written
    read = _within(5, lambda: runtime.read_file(sandbox, "trap", max_bytes=10))
    assert isinstance(read, RuntimeRefusal) and read.code == "invalid_path", read


#: Calls the seccomp filter refuses, each with arguments that would fail otherwise with another
#: errno than EPERM or succeed (a user namespace: ENOSPC under bwrap's --disable-userns; ptrace:
#: success; the others: EOPNOTSUPP, EINVAL, EFAULT, EINVAL for their invalid arguments).
SECCOMP_PROBE = """
import ctypes, errno, json, platform
libc = ctypes.CDLL(None, use_errno=True)
number = {"x86_64": {"keyctl": 250, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323},
          "aarch64": {"keyctl": 219, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282}}[platform.machine()]
calls = {
    "unshare": lambda: libc.unshare(0x10000000),  # CLONE_NEWUSER
    "ptrace": lambda: libc.ptrace(0, 0, None, None),  # PTRACE_TRACEME
    "keyctl": lambda: libc.syscall(number["keyctl"], 9999, 0, 0, 0, 0),
    "bpf": lambda: libc.syscall(number["bpf"], 9999, None, 0),
    "perf_event_open": lambda: libc.syscall(number["perf_event_open"], None, 0, -1, -1, 0),
    "userfaultfd": lambda: libc.syscall(number["userfaultfd"], 0xFFFF),
}
seen = {name: "ok" if call() != -1 else errno.errorcode[ctypes.get_errno()] for name, call in calls.items()}
seen["seccomp"] = open("/proc/self/status").read().split("Seccomp:")[1].split()[0]
print(json.dumps(seen))
"""


def test_a_command_is_refused_namespaces_tracing_keyrings_ebpf_and_perf_events(runtime, sandbox):
    runtime.write_file(sandbox, "probe.py", SECCOMP_PROBE.encode())

    result = runtime.run(sandbox, CommandRequest(argv=("python3", "probe.py"), timeout_s=30))

    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen.pop("seccomp") == "2"  # SECCOMP_MODE_FILTER
    assert seen == dict.fromkeys(("unshare", "ptrace", "keyctl", "bpf", "perf_event_open", "userfaultfd"), "EPERM")
