"""A real Lab stack for end-to-end tests: uvicorn, a Celery worker with beat, engine processes.

``jobs.processes.LabProcesses``, the process manager of ``make up`` and the demo, starts and
stops them; their logs are under ``<data dir>/logs``. The processes share the test database
(PostgreSQL; rows must be committed, so tests use ``django_db(transaction=True)``) and a Redis
broker database that is emptied first.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from django.db import connection

from jobs.processes import ROOT, LabProcesses, free_port  # noqa: F401 (re-exported for the tests)

#: The marks of a test that runs the stack: an e2e test on the PostgreSQL test database the
#: stack's processes share (its rows committed, so ``transaction=True``), with prices set.
STACK_TEST_MARKS = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]


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
    """Start and stop Lab's processes around one test; every process logs under ``data_dir/logs``.

    ``env`` overrides variables of the processes' environment (``LAB_LOCAL_SLOTS="2"``, ...).
    """

    def __init__(self, data_dir: Path, **env: str):
        self.data_dir = data_dir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        broker = os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/1"
        self._lab = LabProcesses(
            data_dir=data_dir,
            port=self.port,
            env={
                **os.environ,
                "DATABASE_URL": _database_url(),
                "CELERY_BROKER_URL": broker,
                "LAB_DATA_DIR": str(data_dir),
                "LAB_MODEL_DIR": os.environ.get("LAB_MODEL_DIR", str(ROOT / "var" / "models")),
                "LAB_PUBLIC_URL": self.base_url,
                "LAB_RECONCILE_INTERVAL_S": "1",
                "DJANGO_SETTINGS_MODULE": "lab.settings",
                **env,
            },
        )
        #: The processes' environment; a change reaches the processes started after it.
        self.env = self._lab.env
        redis.Redis.from_url(broker).flushdb()

    @property
    def processes(self) -> dict:
        """The running processes by name (``web``, ``worker``): their ``subprocess.Popen``."""
        return self._lab.processes

    def start_web(self) -> None:
        """Start uvicorn and wait until it answers /healthz."""
        self._lab.start_web()
        self._lab.wait_until_healthy(timeout=60)

    def start_worker(self) -> None:
        """Start a Celery worker (2 processes) on every queue, with beat embedded."""
        self._lab.start_worker(embedded_beat=True)

    def start(self) -> LabStack:
        """Start web and worker."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.start_web()
        self.start_worker()
        return self

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process group (the worker's children and beat go with it)."""
        self._lab.kill(name, sig)

    def stop(self) -> None:
        """Stop every process, then kill any engine still running under the data dir."""
        self._lab.stop(engine_grace_s=0)

    def logs(self) -> str:
        """Return the tail of every process log (for assertion messages)."""
        return self._lab.logs()


@contextmanager
def running_stack(data_dir: Path, settings, **env: str) -> Iterator[LabStack]:
    """Start a :class:`LabStack` on ``data_dir`` (``env`` as for it), point this process's
    ``settings.LAB_DATA_DIR`` at it, yield it running and stop it however the block ends."""
    lab = LabStack(data_dir, **env)
    settings.LAB_DATA_DIR = lab.data_dir
    try:
        yield lab.start()
    finally:
        lab.stop()
