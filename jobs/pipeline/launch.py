"""Launching: a claimed attempt goes to the configured launcher (``jobs.tasks.launch_attempt``)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs import dispatch, storage
from jobs.checkpoints import checkpoint_resume_archive
from jobs.environment_packages import launch_packages
from jobs.ingest.tokens import bootstrap_token, job_token
from jobs.launchers import registry
from jobs.launchers.base import LauncherUnavailable, LaunchRequest
from jobs.models import AttemptState, ErrorCode, Job, JobAttempt, JobPriority, JobStatus
from jobs.registry.store import launch_model
from jobs.secrets.services import engine_secrets
from jobs.services import job_transition
from lab.lib import locks
from lab.lib.locks import advisory_lock

logger = logging.getLogger(__name__)
S = JobStatus


def launch_request(attempt: JobAttempt) -> LaunchRequest:
    """Return what the launcher needs to start ``attempt`` (its job, project and resume point loaded).

    A resume archive on this machine is first found unchanged since its checkpoint became ready;
    LabError ``checkpoint_corrupted`` (the checkpoint is then failed) or ``not_found`` when it is not
    (``jobs.checkpoints.checkpoint_resume_archive``), which fails the launch."""
    job = attempt.job
    resume = attempt.resume_from
    organization = job.project.organization.slug
    return LaunchRequest(
        job_id=job.public_id,
        attempt=attempt.number,
        spec=job.spec,
        lab_url=settings.LAB_PUBLIC_URL,
        token=job_token(attempt),
        resume_archive=checkpoint_resume_archive(resume) if resume is not None and storage.is_filesystem() else None,
        resume_checkpoint_id=resume.public_id if resume is not None and not storage.is_filesystem() else None,
        organization=organization,
        project=job.project.slug,
        namespace=settings.LAB_K8S_NAMESPACE or f"lab-{organization}",
        priority=JobPriority(job.priority).label,
        gpu_type=job.gpu_type,
        gpus=job.gpus,
        environments=tuple(env.get("id", "") for env in job.spec.get("env", []) if isinstance(env, dict)),
        environment_packages=launch_packages(job),
        model=launch_model(model_id=str(job.spec.get("model", "")), organization_id=job.project.organization_id),
        secrets=engine_secrets(job_id=job.public_id),
        bootstrap_token=bootstrap_token(attempt),
        kind=job.kind,
    )


def attempt_launch(*, attempt_id: int) -> None:
    """Launch a pending attempt through the configured launcher; a no-op once launched.

    No row is locked while the launcher works (on a cluster that is API round trips): the
    attempt is checked, launched, and the handle recorded only if the attempt is still pending;
    if it was cancelled meanwhile, what was launched is stopped again. A launcher error fails
    the job with ``internal_error``.
    """
    launcher = registry.get_launcher()
    with advisory_lock(locks.LAUNCH, attempt_id, wait=False) as claimed:
        if not claimed:
            return
        attempt = (
            JobAttempt.objects.select_related("job__project__organization", "resume_from")
            .filter(pk=attempt_id, state=AttemptState.PENDING)
            .first()
        )
        if attempt is None or attempt.job.status != S.STARTING or attempt.job.attempt != attempt.number:
            return
        try:
            handle = launcher.launch(launch_request(attempt))
        except LauncherUnavailable:  # e.g. the cluster API is down: the attempt stays pending, relaunched later
            logger.warning("launcher unavailable; launch postponed", extra={"job": attempt.job.public_id})
            return
        except Exception as exc:  # the launcher's failure ends this job, not the worker
            logger.exception("launch failed", extra={"job": attempt.job.public_id, "attempt": attempt.number})
            with transaction.atomic():
                job = Job.objects.unscoped().select_for_update().get(pk=attempt.job_id)
                if JobAttempt.objects.filter(pk=attempt_id, state=AttemptState.PENDING).update(
                    state=AttemptState.ENDED, ended_at=timezone.now()
                ) and job.status == S.STARTING:
                    job_transition(
                        job=job, to=S.FAILED, error_code=ErrorCode.INTERNAL_ERROR, error_message=f"Launch failed: {exc}"
                    )
                dispatch.enqueue_admission()
            return
        recorded = JobAttempt.objects.filter(pk=attempt_id, state=AttemptState.PENDING).update(
            state=AttemptState.LAUNCHED, handle=handle, launched_at=timezone.now()
        )
        if not recorded:  # cancelled while launching: stop what was started
            launcher.cancel(handle, force=True)
            launcher.cleanup(handle)
