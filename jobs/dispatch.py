"""Enqueue the run pipeline's Celery tasks once the current transaction commits.

Services, the ingest API and the reconciler call these (over ``lab.dispatch``, which sends by
task name), so a task never runs before the rows it reads are committed (and never runs at all
when the transaction rolls back), and tests have one seam to stub (``no_broker`` in
tests/conftest.py).
"""

from __future__ import annotations

from lab.celery import TaskName
from lab.dispatch import enqueue_on_commit


def enqueue_admission() -> None:
    """Run an admission pass after commit."""
    enqueue_on_commit(TaskName.ADMIT)


def enqueue_launch(attempt_id: int) -> None:
    """Launch the claimed attempt ``attempt_id`` (a JobAttempt primary key) after commit."""
    enqueue_on_commit(TaskName.LAUNCH_ATTEMPT, attempt_id)


def enqueue_reconcile(job_id: int) -> None:
    """Reconcile the job ``job_id`` (a Job primary key) after commit."""
    enqueue_on_commit(TaskName.RECONCILE_JOB, job_id)


def enqueue_evaluation_settle(job_id: int) -> None:
    """Settle the evaluation whose job ``job_id`` (a Job primary key) ended, after commit: its
    results and its webhook (``evaluations``, which sits above ``jobs``)."""
    enqueue_on_commit(TaskName.SETTLE_EVALUATION, job_id)


def enqueue_final_checkpoint_evaluation(job_id: int) -> None:
    """Start the evaluation of the final checkpoint of the training job ``job_id`` (a Job primary
    key) that succeeded, as its ``[eval] evaluate_final_checkpoint`` asks, after commit."""
    enqueue_on_commit(TaskName.EVALUATE_FINAL_CHECKPOINT, job_id)
