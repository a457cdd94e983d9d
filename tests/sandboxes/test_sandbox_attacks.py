"""Sandboxes attacked through what their commands leave in /workspace for the agent's file routes
(sandboxes/runtime/local.py): the agent opens those files itself, so nothing a command made may
hold its request or turn a write into anything but a regular file's."""

from __future__ import annotations

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
