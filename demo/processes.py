"""Lab's processes for one machine: uvicorn, a Celery worker and Celery beat, each in its own
process group with its output in a log file, and a stop that also ends the engine attempts their
worker launched (the local launcher detaches those, so they outlive the worker otherwise).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from jobs.launchers.local import process_alive

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a process gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_S = 20.0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port`` (so uvicorn can bind it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class LabProcesses:
    """Start and stop web, worker and beat for the Lab at ``base_url`` with data under ``data_dir``.

    ``env`` is the environment the processes get (Lab's settings variables). Logs go to
    ``data_dir/logs/{web,worker,beat}.log``. Usable as a context manager: leaving it stops
    everything started, engine attempts included.
    """

    def __init__(self, *, data_dir: Path, port: int, env: Mapping[str, str]):
        self.data_dir = data_dir
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.env = dict(env)
        self.log_dir = data_dir / "logs"
        self.processes: dict[str, subprocess.Popen] = {}
        self.started_at = time.time()

    def run(self, *args: str, what: str) -> str:
        """Run ``python <args>`` (e.g. ``manage.py migrate``) to completion; return its stdout.

        Raises RuntimeError with the command's output tail when it fails.
        """
        result = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=600
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"{what} failed (exit status {result.returncode}):\n{tail}")
        return result.stdout

    def _spawn(self, name: str, args: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            # A session of its own: Ctrl-C reaches only the demo, which then stops each in order.
            self.processes[name] = subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, *, timeout: float = 120.0) -> None:
        """Start uvicorn, a Celery worker on every queue and Celery beat; wait for ``/healthz``.

        Raises RuntimeError (naming the log to read) when a process exits or the server does
        not answer within ``timeout`` seconds.
        """
        self.started_at = time.time()
        self._spawn(
            "web",
            [
                "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(self.port),
                # Live streams stay open until their job ends: stop waiting for them after 5 s.
                "--timeout-graceful-shutdown", "5",
            ],
        )
        self._spawn(
            "worker",
            ["-m", "celery", "-A", "lab", "worker", "--concurrency", "2", "--loglevel", "INFO"],
        )
        self._spawn(
            "beat",
            [
                "-m", "celery", "-A", "lab", "beat", "--loglevel", "INFO",
                "--schedule", str(self.data_dir / "celerybeat-schedule"),
            ],
        )
        deadline = time.monotonic() + timeout
        while not self._healthy():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the web server did not answer within {timeout:.0f} s; see {self.log_dir}/web.log")
            time.sleep(0.3)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def check_alive(self) -> None:
        """Raise RuntimeError naming the first process that has exited, and its log."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"the {name} process exited with status {process.returncode}; see {self.log_dir}/{name}.log"
                )

    def engine_groups(self) -> list[int]:
        """Return the process groups of engine attempts (and their supervisors) that this
        machine's worker launched since :meth:`start` and that are still alive."""
        groups = []
        for pid_file in sorted((self.data_dir / "runs").glob("*/attempt-*/*.pid")):
            if pid_file.name not in ("engine.pid", "supervisor.pid"):
                continue
            try:
                if pid_file.stat().st_mtime < self.started_at - 1:
                    continue
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            # The pid must still be that attempt's process, not a recycled number.
            if process_alive(pid) and str(pid_file.parent) in _cmdline(pid):
                groups.append(pid)
        return groups

    def stop(self) -> None:
        """Stop web, beat and worker (SIGTERM, then SIGKILL after a grace period), then end
        every engine attempt they left behind. Safe to call more than once."""
        for name in ("web", "beat", "worker"):
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                # The leader alone: Celery's main process stops its pool itself (a warm
                # shutdown); a SIGTERM to the whole group makes it wait on children killed under it.
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for name, process in list(self.processes.items()):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            # Children a process left in its group (Celery's pool) go with it.
            _signal_group(process.pid, signal.SIGKILL)
            del self.processes[name]
        groups = self.engine_groups()
        for pid in groups:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while groups and time.monotonic() < deadline:
            time.sleep(0.2)
            groups = [pid for pid in groups if process_alive(pid)]
        for pid in groups:
            _signal_group(pid, signal.SIGKILL)

    def __enter__(self) -> LabProcesses:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
