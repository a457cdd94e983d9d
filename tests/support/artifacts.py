"""Jobs whose engine uploads checkpoints and adapters through the ingest API, for the artifact tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from jobs.artifacts.kinds import ADAPTER, CHECKPOINT, ArtifactKind
from jobs.ingest.tokens import job_token
from jobs.models import Job, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor

#: A job of the tiny model for the live tests: two steps of reverse-text, its final checkpoint kept.
TINY_JOB_SPEC = {
    "model": "lab/tiny-random-llama",
    "max_steps": 2,
    "batch_size": 8,
    "rollouts_per_example": 4,
    "learning_rate": 1e-2,
    "lora_rank": 4,
    "lora_alpha": 8,
    "seed": 3,
    "sampling": {"max_tokens": 6},
    "env": [{"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}}],
    "checkpoints": {"interval": 2, "keep_last": 1},
}

#: Parameterise a test by artifact kind: ``@KIND`` gives it a ``kind`` argument.
KIND = pytest.mark.parametrize("kind", [CHECKPOINT, ADAPTER], ids=lambda kind: kind.name)


@pytest.fixture
def artifact_storage(settings, tmp_path):
    """Give the test an empty object storage directory, so the sweep sees only its files."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "objects")}},
    }


def start(tenant, spec) -> tuple[Job, APIClient, str]:
    """Submit a job and claim its first attempt; return it, an engine client and its ingest base."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return Job.objects.unscoped().get(pk=job.pk), engine, f"/api/v1/ingest/jobs/{job.public_id}"


def next_attempt(job: Job) -> APIClient:
    """Requeue ``job`` as a preemption does, claim its next attempt, return that attempt's engine client."""
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, message="preempted")
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(job_claim_for_start(job_id=job.pk))}")
    return engine


def register(engine: APIClient, base: str, kind: ArtifactKind, step: int, *, attempt: int = 1) -> dict:
    """Register an upload of ``kind`` at ``step``; return the answer's body (``{"id", "upload"}``)."""
    registered = engine.post(f"{base}/{kind.name}s", {"attempt": attempt, "step": step, "format": "peft-lora"}, format="json")
    assert registered.status_code == 201, registered.content
    return registered.json()


def complete(engine: APIClient, base: str, kind: ArtifactKind, artifact_id: str, claimed: bytes):
    """Complete an upload claiming the size and SHA-256 of ``claimed``; return the answer."""
    body = {"size_bytes": len(claimed), "sha256": hashlib.sha256(claimed).hexdigest()}
    return engine.post(f"{base}/{kind.name}s/{artifact_id}/complete", body, format="json")


def upload(
    engine: APIClient, base: str, kind: ArtifactKind, step: int, content: bytes, *,
    claimed: bytes | None = None, attempt: int = 1,
) -> dict:
    """Register, store ``content`` where Lab says, complete with the hash of ``claimed`` (default:
    ``content``); return ``{"id", "upload", "status"}``."""
    body = register(engine, base, kind, step, attempt=attempt)
    assert body["upload"]["method"] == "local"
    Path(body["upload"]["path"]).write_bytes(content)
    completed = complete(engine, base, kind, body["id"], content if claimed is None else claimed)
    assert completed.status_code == 200, completed.content
    return {**body, "status": completed.json()["status"]}


def finish(job: Job) -> None:
    """End a job that its engine's reports made ``running``."""
    job = Job.objects.unscoped().get(pk=job.pk)
    assert job.status == JobStatus.RUNNING
    job_transition(job=job, to=JobStatus.SUCCEEDED)
