"""Enqueue the run pipeline's Celery tasks once the current transaction commits.

Services, the ingest API and the reconciler call these instead of importing ``jobs.tasks``, so a
task never runs before the rows it reads are committed (and never runs at all when the
transaction rolls back), and tests have one seam to stub (``no_broker`` in tests/conftest.py).
"""

from __future__ import annotations

from django.db import transaction


def enqueue_admission() -> None:
    """Run an admission pass after commit."""
    from jobs import tasks

    transaction.on_commit(tasks.admit.delay)


def enqueue_launch(attempt_id: int) -> None:
    """Launch the claimed attempt ``attempt_id`` (a JobAttempt primary key) after commit."""
    from jobs import tasks

    transaction.on_commit(lambda: tasks.launch_attempt.delay(attempt_id))


def enqueue_reconcile(job_id: int) -> None:
    """Reconcile the job ``job_id`` (a Job primary key) after commit."""
    from jobs import tasks

    transaction.on_commit(lambda: tasks.reconcile_job.delay(job_id))
