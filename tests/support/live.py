"""A live Lab's API and the engine processes it starts, as the end-to-end tests watch them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from tests.support.stack import LabStack, wait_for

TERMINAL = {"succeeded", "failed", "cancelled"}


class Api:
    """A few REST calls with the tenant's key."""

    def __init__(self, stack: LabStack, key: str):
        self.client = httpx.Client(base_url=f"{stack.base_url}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        self.stack = stack

    def create(self, spec: dict) -> dict:
        response = self.client.post("/jobs", json=spec)
        assert response.status_code == 201, response.text
        return response.json()

    def get(self, job_id: str) -> dict:
        return self.client.get(f"/jobs/{job_id}").json()

    def wait_status(self, job_id: str, statuses: set[str], timeout: float = 180) -> dict:
        def reached():
            job = self.get(job_id)
            return job if job["status"] in statuses else None

        try:
            return wait_for(reached, timeout=timeout, what=f"{job_id} in {statuses}")
        except AssertionError:
            raise AssertionError(f"{self.get(job_id)}\n{self.stack.logs()}") from None


def engine_pid(stack: LabStack, job_id: str, attempt: int) -> int | None:
    pid_file = stack.data_dir / "runs" / job_id / f"attempt-{attempt}" / "engine.pid"
    try:
        return int(pid_file.read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def _spooled_steps(attempt_dir: Path) -> int:
    """The highest step the engine has written to its metrics spool (0 before the first)."""
    spool = attempt_dir / "spool" / "attempt-1" / "metrics.jsonl"
    if not spool.exists():
        return 0
    steps = [json.loads(line)["step"] for line in spool.read_text().splitlines() if line.endswith("}")]
    return max(steps, default=0)
