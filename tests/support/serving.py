"""Deployable things for the serving tests: ready adapters and checkpoints of the tiny model,
uploaded through the ingest API as a job's engine would, with real weights inside."""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import httpx

from engine.models import context_length, stop_token_ids, tiny_random_llama
from engine.serving import ServingServer
from engine.serving_transformers import TransformersServing
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT, ArtifactKind
from jobs.ingest.tokens import job_token
from jobs.models import Job, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from tests.support import http_server
from tests.support.artifacts import TINY_JOB_SPEC, start
from tests.support.tiny_lora import tiny_lora

TINY = "lab/tiny-random-llama"


def _tar_of_directory(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.add(path, arcname=path.relative_to(directory).as_posix())
    return buffer.getvalue()


@cache
def adapter_archive(fill: float) -> bytes:
    """A tar of a rank-4 LoRA adapter of the tiny model whose ``lora_B`` weights are all ``fill``."""
    model, tokenizer = tiny_lora(fill)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        return _tar_of_directory(Path(directory))


@cache
def full_archive(seed: int = 1) -> bytes:
    """A tar of full Hugging Face weights of the tiny model (random weights from ``seed``), with
    its tokenizer and a ``trainer_state/`` as a checkpoint has."""
    model, tokenizer = tiny_random_llama(seed)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory, safe_serialization=True)
        tokenizer.save_pretrained(directory)
        (Path(directory) / "trainer_state").mkdir()
        (Path(directory) / "trainer_state" / "state.json").write_text("{}")
        return _tar_of_directory(Path(directory))


def ready_artifact(tenant, kind: ArtifactKind, content: bytes, *, format: str = "peft-lora", step: int = 2) -> str:
    """Upload ``content`` as a ready artifact of ``kind`` of a new job of the tiny model in the
    tenant's project (the job's engine registering, uploading and completing it); return its id."""
    job, engine, base = start(tenant, TINY_JOB_SPEC)
    registered = engine.post(f"{base}/{kind.name}s", {"attempt": 1, "step": step, "format": format}, format="json")
    assert registered.status_code == 201, registered.content
    body = registered.json()
    Path(body["upload"]["path"]).parent.mkdir(parents=True, exist_ok=True)
    Path(body["upload"]["path"]).write_bytes(content)
    claim = {"size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    completed = engine.post(f"{base}/{kind.name}s/{body['id']}/complete", claim, format="json")
    assert completed.status_code == 200 and completed.json()["status"] == "ready", completed.content
    assert Job.objects.unscoped().get(pk=job.pk).model == TINY
    return body["id"]


def ready_adapter(tenant, fill: float = 0.5) -> str:
    """A ready LoRA adapter artifact (``adp_...``) of the tiny model."""
    return ready_artifact(tenant, ADAPTER, adapter_archive(fill))


def ready_lora_checkpoint(tenant, fill: float = -0.5) -> str:
    """A ready ``peft-lora`` checkpoint (``ckpt_...``) of the tiny model."""
    return ready_artifact(tenant, CHECKPOINT, adapter_archive(fill))


def ready_full_checkpoint(tenant, seed: int = 1) -> str:
    """A ready ``hf-full`` checkpoint (``ckpt_...``) of the tiny model."""
    return ready_artifact(tenant, CHECKPOINT, full_archive(seed), format="hf-full")


def ready_artifact_through(base_url: str, tenant, kind: ArtifactKind, content: bytes, *, format: str = "peft-lora") -> str:
    """Upload ``content`` as a ready artifact of ``kind`` of a new job of the tiny model, through
    the ingest API of the Lab at ``base_url`` (a running stack) as the job's engine would, then
    end the job (succeeded), so that no reconciler takes its attempt up; return the artifact's id."""
    job = job_submit(project=tenant.project, actor=Actor(user=tenant.user), data=TINY_JOB_SPEC)
    attempt = job_claim_for_start(job_id=job.pk)
    engine = httpx.Client(base_url=f"{base_url}/api/v1/ingest/jobs/{job.public_id}",
                          headers={"Authorization": f"Bearer {job_token(attempt)}"}, timeout=60)
    with engine:
        assert engine.post("/status", json={"attempt": 1, "phase": "running", "step": 2}).status_code == 200
        body = engine.post(f"/{kind.name}s", json={"attempt": 1, "step": 2, "format": format}).json()
        Path(body["upload"]["path"]).parent.mkdir(parents=True, exist_ok=True)
        Path(body["upload"]["path"]).write_bytes(content)
        completed = engine.post(f"/{kind.name}s/{body['id']}/complete",
                                json={"size_bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()})
        assert completed.json()["status"] == "ready", completed.text
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    return body["id"]


@contextmanager
def tiny_serving_engine(*, max_adapters: int = 1, token: str = "engine-token") -> Iterator[tuple[ServingServer, str]]:
    """The tiny model's serving role (transformers backend) on a free port of this process, as
    ``(server, url)`` for the ``with`` block; its HTTP server stopped after it."""
    model, tokenizer = tiny_random_llama()
    server = ServingServer(backend=TransformersServing(model, stop_token_ids=stop_token_ids(model, tokenizer)), tokenizer=tokenizer,
                           served_model=TINY, max_model_len=context_length(model), token=token, max_adapters=max_adapters)
    with http_server.serving(server.http_server()) as http:
        yield server, "http://%s:%d" % http.server_address[:2]
