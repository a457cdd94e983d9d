"""Jobs with data for the dashboard tests, made through the services and the ingest API as an engine would."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from rest_framework.test import APIClient

from jobs.ingest.tokens import job_token
from jobs.models import Job
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor

NOW = "2026-11-29T22:16:31Z"


class Engine:
    """Reports to the ingest API for one job's first attempt."""

    def __init__(self, job: Job):
        attempt = job_claim_for_start(job_id=job.pk)
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
        self.base = f"/api/v1/ingest/jobs/{job.public_id}"
        self.job = job

    def post(self, path: str, body: dict) -> dict:
        response = self.client.post(f"{self.base}/{path}", body, format="json")
        assert response.status_code in (200, 201), response.content
        return response.json()

    def running(self, step: int = 0) -> None:
        self.post("status", {"attempt": 1, "phase": "running", "step": step})

    def metrics(self, *points: tuple[int, dict]) -> None:
        self.post(
            "metrics",
            {"attempt": 1, "points": [{"step": step, "time": NOW, "values": values} for step, values in points]},
        )

    def samples(self, step: int, rows: list[dict]) -> None:
        self.post("samples", {"attempt": 1, "samples": [{"step": step, "metrics": {}, **row} for row in rows]})

    def logs(self, *lines: str) -> None:
        self.post(
            "logs",
            {
                "attempt": 1,
                "lines": [
                    {"seq": index, "time": NOW, "stream": "stdout", "line": line} for index, line in enumerate(lines)
                ],
            },
        )


def submit(tenant, spec: dict, **changes) -> Job:
    """Submit ``spec`` (with ``changes``) as the tenant's owner; return the job."""
    return job_submit(project=tenant.project, actor=Actor(user=tenant.user), data={**spec, **changes})


def ready_checkpoint(engine: Engine, step: int = 2, data: bytes | None = None) -> tuple[str, bytes]:
    """Upload the archive ``data`` (default: a tar of a one-line ``adapter_config.json``) as the
    job's ``peft-lora`` checkpoint of ``step`` and complete it; return ``(its id, data)``."""
    if data is None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            payload = b'{"r": 8}'
            info = tarfile.TarInfo("adapter_config.json")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
        data = buffer.getvalue()
    registered = engine.post("checkpoints", {"attempt": 1, "step": step, "format": "peft-lora"})
    Path(registered["upload"]["path"]).parent.mkdir(parents=True, exist_ok=True)
    Path(registered["upload"]["path"]).write_bytes(data)
    done = engine.post(
        f"checkpoints/{registered['id']}/complete",
        {"size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    )
    assert done["status"] == "ready", done
    return registered["id"], data
