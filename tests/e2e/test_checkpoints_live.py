"""Checkpoints for real: web, a Celery worker, the local launcher and the engine on the tiny
model. A job's final checkpoint is downloaded through the API, unpacked and loaded with
``peft``/``transformers``; a second job starts from it with ``init_from``. Once on the
filesystem, once on S3 (a moto server process: the engine PUTs to pre-signed URLs and fetches
its init checkpoint through a signed redirect)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import tarfile

import httpx
import pytest
import safetensors.torch
import torch
from labsdk import Lab

from jobs.models import Checkpoint, Job, JobAttempt, LogLine, MetricStep
from jobs.webhooks.models import WebhookMessage
from tests.support.artifacts import TINY_JOB_SPEC
from tests.support.s3server import S3Server
from tests.support.stack import STACK_TEST_MARKS, LabStack, running_stack, wait_for
from tests.support.tiny_lora import adapter_changes_predictions

pytestmark = STACK_TEST_MARKS

SPEC = TINY_JOB_SPEC


@pytest.fixture(params=["filesystem", "s3"])
def storage_kind(request, tmp_path):
    """``(name, extra stack environment, moto server and bucket or None)``."""
    if request.param == "filesystem":
        yield "filesystem", {}, None
        return
    server = S3Server(tmp_path / "moto").start()
    try:
        bucket = server.new_bucket()
        yield "s3", server.environment(bucket), (server, bucket)
    finally:
        server.stop()


@pytest.fixture
def stack(tmp_path, settings, storage_kind):
    _, environment, _ = storage_kind
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_WEBHOOK_ALLOW_PRIVATE="1", **environment) as lab:
        yield lab


@pytest.fixture
def s3_stack(tmp_path, settings):
    """A stack whose checkpoints live on a moto server; yields ``(stack, server, bucket)``."""
    server = S3Server(tmp_path / "moto").start()
    lab = None
    try:
        bucket = server.new_bucket()
        lab = LabStack(tmp_path / "lab", LAB_ENGINE_THREADS="1", LAB_STOP_GRACE_S="2", LAB_KILL_GRACE_S="5",
                       **server.environment(bucket))
        settings.LAB_DATA_DIR = lab.data_dir
        yield lab.start(), server, bucket
    finally:
        if lab is not None:
            lab.stop()
        server.stop()


def wait_done(lab: Lab, stack: LabStack, job_id: str) -> dict:
    def finished():
        job = lab.jobs.retrieve(job_id)
        return job if job.status in {"succeeded", "failed", "cancelled"} else None

    job = wait_for(finished, timeout=300, what=f"{job_id} finished")
    assert job.status == "succeeded", f"{job.to_dict()}\n{stack.logs()}"
    return job


def adapter_weights(directory) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(directory / "adapter_model.safetensors"))


def test_a_tiny_jobs_checkpoint_downloads_loads_with_peft_and_seeds_another_job(stack, storage_kind, owner, tmp_path):
    _, _, s3 = storage_kind
    auth = {"Authorization": f"Bearer {owner.key}"}
    # A subscriber, so the checkpoint.ready webhook is written (its delivery is tests/webhooks' part).
    hook = httpx.post(f"{stack.base_url}/api/v1/webhook-endpoints", headers=auth,
                      json={"url": "http://127.0.0.1:9/never", "events": ["checkpoint.ready"]})
    assert hook.status_code == 201, hook.text
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        source = lab.jobs.create(SPEC)
        wait_done(lab, stack, source.id)
        (final,) = lab.checkpoints.list(source.id)
        assert (final.step, final.status, final.format) == (2, "ready", "peft-lora")
        if s3 is not None:
            server, bucket = s3
            assert server.keys(bucket) == [f"checkpoints/{source.id}/{final.id}.tar"]

        # The webhook's download_url gives the archive (streamed, or a redirect to storage).
        (message,) = [
            json.loads(body) for body in WebhookMessage.objects.filter(type="checkpoint.ready").values_list("body", flat=True)
        ]
        assert message["data"]["checkpoint_id"] == final.id
        fetched = httpx.get(message["data"]["download_url"], headers=auth, follow_redirects=True, timeout=30)
        assert fetched.status_code == 200
        assert hashlib.sha256(fetched.content).hexdigest() == final.sha256
        directory = tmp_path / "source"
        with tarfile.open(fileobj=io.BytesIO(fetched.content), mode="r:") as archive:
            archive.extractall(directory, filter="data")
        through_sdk = lab.checkpoints.download(final.id, tmp_path / "through-sdk", progress=False)
        assert sorted(p.relative_to(through_sdk) for p in through_sdk.rglob("*")) == sorted(
            p.relative_to(directory) for p in directory.rglob("*")
        )
        state = json.loads((directory / "trainer_state" / "state.json").read_text())
        assert (state["step"], state["format"]) == (2, "peft-lora")
        # The adapter trained for two steps at lr 1e-2: it changes what the model predicts.
        assert adapter_changes_predictions(directory)
        source_weights = adapter_weights(directory)
        assert max(w.abs().max().item() for name, w in source_weights.items() if "lora_B" in name) > 1e-3

        # A second job starts from those weights (and from step 1), with a learning rate too
        # small to move them visibly in its single step.
        follower = lab.jobs.create({**SPEC, "max_steps": 1, "learning_rate": 1e-7, "seed": 11, "init_from": final.id,
                                    "checkpoints": {"interval": 1, "keep_last": 1}})
        wait_done(lab, stack, follower.id)
        (seeded,) = lab.checkpoints.list(follower.id)
        assert seeded.step == 1
        seeded_weights = adapter_weights(lab.checkpoints.download(seeded.id, tmp_path / "seeded", progress=False))
        assert seeded_weights.keys() == source_weights.keys()
        for name, weight in source_weights.items():
            assert torch.allclose(seeded_weights[name], weight, atol=1e-5), name
        assert list(MetricStep.objects.filter(job__public_id=follower.id).values_list("step", flat=True)) == [1]
        logs = list(LogLine.objects.filter(job__public_id=follower.id).values_list("line", flat=True))
        assert any("initialised from" in line and "(its step 2); training starts at step 1" in line for line in logs), logs
        # The source's final checkpoint stays while it is someone's init_from, and after.
        assert Checkpoint.objects.unscoped().get(public_id=final.id).status == "ready"


def test_a_killed_engine_resumes_from_a_checkpoint_stored_on_s3(s3_stack, owner, spec):
    stack, server, bucket = s3_stack
    spec.update(max_steps=6, checkpoints={"interval": 2, "keep_last": 3}, max_restarts=2)
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        job_id = lab.jobs.create(spec).id
        wait_for(
            lambda: Job.objects.unscoped().filter(public_id=job_id, checkpoints__status="ready").exists(),
            timeout=180,
            what="a ready checkpoint",
        )
        pid_file = stack.data_dir / "runs" / job_id / "attempt-1" / "engine.pid"
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        done = wait_done(lab, stack, job_id)
    assert done.attempt == 2
    attempt = JobAttempt.objects.get(job__public_id=job_id, number=2)
    resumed_from = attempt.resume_from
    assert resumed_from is not None
    # The launcher had no archive to unpack: the engine fetched the checkpoint from Lab by id.
    # Stored log lines name the data dir as $LAB_DATA_DIR (server paths stay out of what users read).
    workdir = f"$LAB_DATA_DIR/runs/{job_id}/attempt-2"
    expected = f"resumed from {workdir}/resume/{resumed_from.public_id} at step {resumed_from.step}"
    logs = list(LogLine.objects.filter(job__public_id=job_id, attempt=2).values_list("line", flat=True))
    assert any(expected in line for line in logs), logs
    rows = list(MetricStep.objects.filter(job__public_id=job_id).order_by("step").values_list("step", "attempt"))
    assert [step for step, _ in rows] == [1, 2, 3, 4, 5, 6]
    assert all(number == 2 for step, number in rows if step > resumed_from.step)
    assert all(number == 1 for step, number in rows if step <= resumed_from.step)
    ready = Checkpoint.objects.unscoped().filter(job__public_id=job_id, status="ready").order_by("step")
    everything = list(Checkpoint.objects.unscoped().filter(job__public_id=job_id).values_list("public_id", "attempt", "step", "status"))
    assert server.keys(bucket) == sorted(f"checkpoints/{job_id}/{c.public_id}.tar" for c in ready), everything
