"""Celery tasks of the run pipeline: thin, idempotent adapters over admission and the reconciler
(``jobs.pipeline``).

Imported by the worker and beat only (``lab.celery``); producers send these by ``TaskName``
through ``jobs.dispatch``.
"""

from __future__ import annotations

from jobs import admission
from jobs.artifacts import lifecycle
from jobs.pipeline import launch, reconciler
from lab.celery import TaskName, task


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
