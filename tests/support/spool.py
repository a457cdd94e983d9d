"""Launched jobs and their spools, for the spool delivery tests."""

from __future__ import annotations

from pathlib import Path

from django.utils import timezone

from engine.spool import Spool, attempt_spool_dir
from jobs.models import AttemptState, Job, JobAttempt
from jobs.services import job_claim_for_start, job_submit
from lab.audit import Actor
from tests.support.fake_launcher import FakeLauncher

NOW = "2026-11-29T22:16:31Z"


def exited_launcher(exit_code: int = 0) -> FakeLauncher:
    """A fake launcher on which the attempt of handle 1 has exited with ``exit_code``."""
    launcher = FakeLauncher()
    launcher.exit({"id": 1}, exit_code)
    return launcher


def launched(owner, spec, workdir: Path) -> tuple[Job, JobAttempt]:
    """A job whose first attempt was launched with ``workdir`` as its work dir."""
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    JobAttempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.LAUNCHED, handle={"id": 1, "workdir": str(workdir)}, launched_at=timezone.now()
    )
    return Job.objects.unscoped().get(pk=job.pk), JobAttempt.objects.get(pk=attempt.pk)


def spool(workdir: Path, name: str, records: list[dict], *, sent: int = 0) -> None:
    writer = Spool(attempt_spool_dir(workdir, 1), name)
    for record in records:
        writer.append(record)
    if sent:
        writer.acknowledge(sent)
    writer.close()


def point(step: int) -> dict:
    return {"step": step, "time": NOW, "values": {"reward/mean": step / 10}}
