"""Checkpoint archives leave the ASGI server as a stream, not read whole into memory first."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings

from jobs.ingest.tokens import job_token
from jobs.models import Job
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.support.stack import LabStack

pytestmark = [pytest.mark.usefixtures("no_broker"), pytest.mark.django_db(transaction=True), pytest.mark.e2e]

ARCHIVE_MB = 96


def _memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_a_large_archive_is_streamed_by_uvicorn_without_being_held_in_memory(owner, spec, tmp_path):
    stack = LabStack(tmp_path / "stack", SECRET_KEY=django_settings.SECRET_KEY)
    stack.data_dir.mkdir(parents=True)
    stack.start_web()
    try:
        job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
        attempt = job_claim_for_start(job_id=job.pk)
        job = Job.objects.unscoped().get(pk=job.pk)
        engine = httpx.Client(
            base_url=f"{stack.base_url}/api/v1/ingest/jobs/{job.public_id}",
            headers={"Authorization": f"Bearer {job_token(attempt)}"},
            timeout=120,
        )
        registered = engine.post("/checkpoints", json={"attempt": 1, "step": 1, "format": "peft-lora"}).json()
        block = os.urandom(1024 * 1024)
        digest = hashlib.sha256()
        with open(registered["upload"]["path"], "wb") as upload:
            for _ in range(ARCHIVE_MB):
                upload.write(block)
                digest.update(block)
        size = ARCHIVE_MB * len(block)
        completed = engine.post(
            f"/checkpoints/{registered['id']}/complete", json={"size_bytes": size, "sha256": digest.hexdigest()}
        )
        assert completed.json()["status"] == "ready", completed.text

        pid = stack.processes["web"].pid
        before = _memory_kib(pid, "VmRSS")
        received = hashlib.sha256()
        length = 0
        with httpx.stream(
            "GET",
            f"{stack.base_url}/api/v1/checkpoints/{registered['id']}/download",
            headers={"Authorization": f"Bearer {owner.key}"},
            timeout=120,
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-length"] == str(size)
            assert response.headers["content-disposition"].startswith("attachment; filename=")
            for chunk in response.iter_bytes():
                received.update(chunk)
                length += len(chunk)
        peak = _memory_kib(pid, "VmHWM")
    finally:
        stack.stop()
    assert (length, received.hexdigest()) == (size, digest.hexdigest())
    assert peak - before < ARCHIVE_MB * 1024 // 3, f"the server's memory rose by {(peak - before) // 1024} MiB"
    assert "consume synchronous iterators" not in stack.logs()
