"""A real sandbox agent (``python -m sandboxes.agent``) for tests: one process per test session on
a free port, its sandboxes under a temporary folder, and the settings that point Lab at it."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningAgent:
    """The agent's ``url``, its ``secret``, the ``root`` of its sandboxes and its process."""

    url: str
    secret: str
    root: Path
    process: subprocess.Popen

    def stop(self) -> None:
        """Stop the agent and remove the folder its sandboxes were under."""
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.root.parent, ignore_errors=True)


def start_agent(*, max_processes: int = 64, max_open_files: int = 256, warm: int = 2, like: RunningAgent | None = None,
                secret: str | None = None) -> RunningAgent:
    """Start an agent and wait until it answers ``/healthz`` (RuntimeError when it does not); with
    ``like``, on that agent's port, secret and root (the same agent restarted); with ``secret``,
    signing with that one (agents of one pool share Lab's)."""
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        raise RuntimeError("bubblewrap and prlimit are needed to run sandboxes")
    if like is not None:
        port, secret, root = int(like.url.rsplit(":", 1)[1]), like.secret, like.root
    else:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        root = Path(tempfile.mkdtemp(prefix="lab-agent-")) / "sandboxes"
        secret = secret or secrets.token_hex(32)
    environment = {**os.environ, "LAB_SANDBOX_AGENT_SECRET": secret}
    process = subprocess.Popen(
        [sys.executable, "-m", "sandboxes.agent", "--root", str(root), "--port", str(port),
         "--max-processes", str(max_processes), "--max-open-files", str(max_open_files), "--warm", str(warm)],
        cwd=ROOT, env=environment, stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the sandbox agent exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return RunningAgent(url=url, secret=secret, root=root, process=process)
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the sandbox agent did not answer within 30 s")
