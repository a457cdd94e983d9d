"""What an engine left in its spool when it exited is delivered by Lab before the exit is applied
(jobs.ingest.spool, jobs.pipeline), on a fake launcher that reports a finished process."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from django.db import transaction

from engine.checkpoint_archives import write_tar
from engine.spool import attempt_spool_dir
from jobs.launchers import registry
from jobs.pipeline import reconciler
from jobs.artifacts import lifecycle
from jobs.artifacts.kinds import CHECKPOINT
from jobs.ingest.spool import deliver_attempt_spool
from jobs.models import Checkpoint, Job, JobEvent, LogLine, MetricStep, RolloutSample
from tests.support.spool import NOW, exited_launcher, launched, point, spool

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "checkpoints")}},
    }


def archive(workdir: Path, step: int) -> dict:
    directory = workdir / "checkpoints" / f"step-{step:06d}"
    (directory / "trainer_state").mkdir(parents=True)
    (directory / "trainer_state" / "state.json").write_text(f'{{"step": {step}}}')
    path = directory.with_name(directory.name + ".tar")
    size, digest = write_tar(directory, path)
    return {"step": step, "format": "peft-lora", "archive": str(path), "size_bytes": size, "sha256": digest}


def test_it_stores_what_the_spool_holds_past_its_cursors_and_moves_them_on(owner, spec, tmp_path):
    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    spool(workdir, "metrics", [point(1), point(2), point(3)], sent=1)
    spool(workdir, "logs", [{"seq": n, "time": NOW, "stream": "stdout", "line": f"line {n}"} for n in range(3)])
    spool(workdir, "samples", [{"step": 3, "group": 0, "prompt": "p", "completion": "c", "reward": 1.0, "advantage": 0.5, "metrics": {}}])
    spool(workdir, "checkpoints", [archive(workdir, 3)])

    delivery = deliver_attempt_spool(attempt=attempt, workdir=workdir)

    assert delivery.complete
    assert delivery.delivered == {"metrics": 2, "logs": 3, "samples": 1, "checkpoints": 1}
    assert sorted(MetricStep.objects.filter(job=job).values_list("step", flat=True)) == [2, 3]  # step 1 was sent
    assert LogLine.objects.filter(job=job).count() == 3 and RolloutSample.objects.filter(job=job).count() == 1
    (checkpoint,) = Checkpoint.objects.unscoped().filter(job=job)
    assert (checkpoint.step, checkpoint.attempt, checkpoint.status) == (3, 1, "ready")
    assert (attempt_spool_dir(workdir, 1) / "metrics.sent").read_text() == "3"
    again = deliver_attempt_spool(attempt=attempt, workdir=workdir)
    assert again.delivered == {} and Checkpoint.objects.unscoped().filter(job=job).count() == 1


def test_it_never_copies_an_archive_from_outside_the_work_dir(owner, spec, tmp_path):
    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET_KEY=do-not-leak")
    (workdir / "checkpoints").mkdir(parents=True)
    link = workdir / "checkpoints" / "step-000002.tar"
    os.symlink(secret, link)
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    size = secret.stat().st_size
    spool(workdir, "checkpoints", [
        {"step": 1, "format": "peft-lora", "archive": str(secret), "size_bytes": size, "sha256": digest},
        {"step": 2, "format": "peft-lora", "archive": str(link), "size_bytes": size, "sha256": digest},
        {"step": 3, "format": "peft-lora", "archive": "../secret.txt", "size_bytes": size, "sha256": digest},
    ])

    deliver_attempt_spool(attempt=attempt, workdir=workdir)

    assert dict(Checkpoint.objects.unscoped().filter(job=job).values_list("step", "status")) == {1: "failed", 2: "failed", 3: "failed"}
    stored = [p for p in (tmp_path / "checkpoints").rglob("*") if p.is_file()]
    assert stored == []


def test_it_refuses_malformed_records_and_says_so_in_a_data_incomplete_warning(owner, spec, tmp_path, monkeypatch):
    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    spool(workdir, "metrics", [point(1), {"step": "one", "values": {}}])
    spool(workdir, "checkpoints", [{"step": 3, "format": "zip"}])
    monkeypatch.setattr(registry, "get_launcher", exited_launcher)

    reconciler.reconcile_job(job_id=job.pk)

    job = Job.objects.unscoped().get(pk=job.pk)
    assert job.status == "succeeded"
    warnings = list(JobEvent.objects.filter(job=job, type="job.data_incomplete").order_by("id"))
    assert [w.message for w in warnings] == [
        "Attempt 1 left reports Lab could not store: 1 checkpoints, 2 metrics.",
        "The job finished, but Lab never received metrics of 3 steps (1-3) and the final checkpoint (step 3, never registered).",
    ]
    assert warnings[0].level == "warning" and warnings[0].data["refused"] == {"metrics": 2, "checkpoints": 1}


def test_a_clean_exit_with_everything_delivered_records_no_warning(owner, spec, tmp_path, monkeypatch):
    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    spool(workdir, "metrics", [point(1), point(2), point(3)])
    spool(workdir, "checkpoints", [archive(workdir, 2), archive(workdir, 3)])
    monkeypatch.setattr(registry, "get_launcher", exited_launcher)

    reconciler.reconcile_job(job_id=job.pk)

    job = Job.objects.unscoped().get(pk=job.pk)
    assert job.status == "succeeded"
    assert not JobEvent.objects.filter(job=job, type="job.data_incomplete").exists()
    # Reports delivered after the exit never claim the engine was training.
    assert not JobEvent.objects.filter(job=job, type="job.started").exists()
    assert dict(Checkpoint.objects.unscoped().filter(job=job).values_list("step", "status")) == {2: "ready", 3: "ready"}


def test_an_ended_attempts_unfinished_upload_fails_at_once(owner, spec, tmp_path, monkeypatch):
    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    spool(workdir, "metrics", [point(1), point(2), point(3)])
    spool(workdir, "checkpoints", [archive(workdir, 3)])
    with transaction.atomic():
        stuck, _ = lifecycle.register(CHECKPOINT, job=job, attempt=attempt, step=2, format="peft-lora")
    monkeypatch.setattr(registry, "get_launcher", exited_launcher)

    reconciler.reconcile_job(job_id=job.pk)

    assert Checkpoint.objects.unscoped().get(pk=stuck.pk).status == "failed"
    from jobs.serializers import job_to_dict

    assert job_to_dict(Job.objects.unscoped().get(pk=job.pk))["latest_checkpoint"]["step"] == 3


def test_a_checkpoint_the_engine_completed_is_not_stored_again(owner, spec, tmp_path):
    from jobs import storage

    workdir = tmp_path / "attempt-1"
    job, attempt = launched(owner, spec, workdir)
    record = archive(workdir, 3)
    spool(workdir, "checkpoints", [record])  # the engine died before moving its cursor
    first = deliver_attempt_spool(attempt=attempt, workdir=workdir)
    (attempt_spool_dir(workdir, 1) / "checkpoints.sent").unlink()  # as if the cursor write was lost

    again = deliver_attempt_spool(attempt=attempt, workdir=workdir)

    (checkpoint,) = Checkpoint.objects.filter(job=job)
    assert first.delivered == again.delivered == {"checkpoints": 1} and checkpoint.status == "ready"
    assert [key for key, _ in storage.iter_objects()] == [checkpoint.storage_key]  # no upload left behind
