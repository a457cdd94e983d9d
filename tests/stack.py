"""A real Lab stack for end-to-end tests: uvicorn, a Celery worker with beat, engine processes.

The processes share the test database (PostgreSQL; rows must be committed, so tests use
``django_db(transaction=True)``) and a Redis broker database that is emptied first.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """Return a TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], object], *, timeout: float, interval: float = 0.25, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; return it, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout} s")


def _database_url() -> str:
    settings = connection.settings_dict
    if connection.vendor != "postgresql":
        raise RuntimeError("the end-to-end stack needs PostgreSQL (set DATABASE_URL)")
    user = settings.get("USER") or "postgres"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings['NAME']}"


class LabStack:
    """Start and stop Lab's processes around one test; every process logs under ``data_dir``."""

    def __init__(self, data_dir: Path, **env: str):
        self.data_dir = data_dir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        broker = os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/1"
        self.env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "CELERY_BROKER_URL": broker,
            "LAB_DATA_DIR": str(data_dir),
            "LAB_MODEL_DIR": os.environ.get("LAB_MODEL_DIR", str(ROOT / "var" / "models")),
            "LAB_PUBLIC_URL": self.base_url,
            "LAB_RECONCILE_INTERVAL_S": "1",
            "DJANGO_SETTINGS_MODULE": "lab.settings",
            **env,
        }
        redis.Redis.from_url(broker).flushdb()
        self.processes: dict[str, subprocess.Popen] = {}

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.data_dir / f"{name}.log", "ab")
        process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes[name] = process
        return process

    def start_web(self) -> None:
        """Start uvicorn and wait until it answers /healthz."""
        self._spawn(
            "web",
            [
                sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(self.port),
                # Live streams stay open until their job ends: stop waiting for them after 5 s.
                "--timeout-graceful-shutdown", "5",
            ],
        )
        wait_for(self._healthy, timeout=60, what="the web server")

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self) -> None:
        """Start a Celery worker (2 processes) with beat embedded."""
        self._spawn(
            "worker",
            [
                sys.executable, "-m", "celery", "-A", "lab", "worker", "-B",
                "--schedule", str(self.data_dir / "celerybeat-schedule"),
                # The bare command of DESIGN.md §4: it must consume every queue by itself.
                "--concurrency", "2", "--loglevel", "INFO",
            ],
        )

    def start(self) -> LabStack:
        """Start web and worker."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.start_web()
        self.start_worker()
        return self

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process group (the worker's children and beat go with it)."""
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def stop(self) -> None:
        """Stop every process, then end any engine still running under the data dir."""
        for name in list(self.processes):
            process = self.processes[name]
            try:
                # The leader alone: a Celery worker shuts its pool down itself, and hangs when
                # its children get SIGTERM from the group at the same time.
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(process.pid, signal.SIGKILL)  # whatever the leader left behind
            except ProcessLookupError:
                pass
            process.wait(timeout=10)
            self.processes.pop(name)
        for pid_file in self.data_dir.glob("runs/*/attempt-*/engine.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass

    def logs(self) -> str:
        """Return the tail of every process log (for assertion messages)."""
        parts = []
        for log in sorted(self.data_dir.glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)
