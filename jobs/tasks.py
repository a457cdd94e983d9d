"""Celery tasks of the run pipeline: thin, idempotent adapters over admission and the reconciler
(``jobs.pipeline``).

Imported by the worker and beat only (``lab.celery``); producers send these by ``TaskName``
through ``jobs.dispatch``.
"""

from __future__ import annotations

from django.conf import settings

from jobs import admission
from jobs.artifacts import lifecycle
from jobs.pipeline import launch, reconciler
from jobs.registry import builds as model_builds
from lab.celery import TaskName, task

_MODEL_CHECK_TIMEOUT_S = settings.LAB_MODEL_CHECK_TIMEOUT_S


@task(TaskName.ADMIT, soft_time_limit=60, time_limit=90)
def admit() -> int:
    """Run one admission pass; return how many jobs started."""
    return len(admission.admission_pass().started)


@task(TaskName.LAUNCH_ATTEMPT, soft_time_limit=120, time_limit=180)
def launch_attempt(attempt_id: int) -> None:
    """Launch one claimed attempt (a no-op when it was launched already)."""
    launch.attempt_launch(attempt_id=attempt_id)


@task(TaskName.RECONCILE_JOB, soft_time_limit=60, time_limit=90)
def reconcile_job(job_id: int) -> None:
    """Reconcile one job now (after an engine's finish report or a cancel)."""
    reconciler.reconcile_job(job_id=job_id)


@task(TaskName.RECONCILE, soft_time_limit=120, time_limit=180)
def reconcile() -> int:
    """Periodic pass: reconcile every active job, end orphans, then admit what now fits."""
    seen = reconciler.reconcile_all()
    admission.admission_pass()
    return seen


@task(TaskName.SWEEP_ORPHAN_CHECKPOINTS, soft_time_limit=600, time_limit=660)
def sweep_orphan_checkpoints() -> int:
    """Periodic pass: delete stored checkpoint archives that no checkpoint row refers to."""
    return lifecycle.sweep_orphans()


@task(TaskName.CHECK_MODEL, soft_time_limit=_MODEL_CHECK_TIMEOUT_S + model_builds.TASK_GRACE_S - 60,
      time_limit=_MODEL_CHECK_TIMEOUT_S + model_builds.TASK_GRACE_S)
def check_model(build_id: int) -> None:
    """Run the queued check of a pushed model (a no-op once it has run)."""
    model_builds.build_run(build_id)


@task(TaskName.SWEEP_MODEL_BUILDS, soft_time_limit=120, time_limit=180)
def sweep_model_builds() -> dict[str, int]:
    """Periodic pass: fail checks a lost worker left running, send long-queued ones again."""
    return model_builds.build_sweep()
