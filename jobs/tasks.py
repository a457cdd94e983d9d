"""Celery tasks of the run pipeline: thin, idempotent adapters over admission and the reconciler."""

from __future__ import annotations

from celery import shared_task

from lab.celery import Queue


@shared_task(name="jobs.admit", queue=Queue.ADMISSION, soft_time_limit=60, time_limit=90)
def admit() -> int:
    """Run one admission pass; return how many jobs started."""
    from jobs.admission import admission_pass

    return len(admission_pass().started)


@shared_task(name="jobs.launch_attempt", queue=Queue.ADMISSION, soft_time_limit=120, time_limit=180)
def launch_attempt(attempt_id: int) -> None:
    """Launch one claimed attempt (a no-op when it was launched already)."""
    from jobs.reconciler import attempt_launch

    attempt_launch(attempt_id=attempt_id)


@shared_task(name="jobs.reconcile_job", queue=Queue.RECONCILER, soft_time_limit=60, time_limit=90)
def reconcile_job(job_id: int) -> None:
    """Reconcile one job now (after an engine's finish report or a cancel)."""
    from jobs.reconciler import reconcile_job as reconcile

    reconcile(job_id=job_id)


@shared_task(name="jobs.reconcile", queue=Queue.RECONCILER, soft_time_limit=120, time_limit=180)
def reconcile() -> int:
    """Periodic pass: reconcile every active job, end orphans, then admit what now fits."""
    from jobs.admission import admission_pass
    from jobs.reconciler import reconcile_all

    seen = reconcile_all()
    admission_pass()
    return seen


@shared_task(name="jobs.sweep_orphan_checkpoints", queue=Queue.DEFAULT, soft_time_limit=600, time_limit=660)
def sweep_orphan_checkpoints() -> int:
    """Periodic pass: delete stored checkpoint archives that no checkpoint row refers to."""
    from jobs.checkpoints import checkpoint_sweep_orphans

    return checkpoint_sweep_orphans()
