"""Celery tasks of evaluations: thin wrappers over ``evaluations.services``."""

from __future__ import annotations

from evaluations.services import evaluation_of_final_checkpoint, evaluation_settle
from lab.celery import TaskName, task


@task(TaskName.SETTLE_EVALUATION, soft_time_limit=300, time_limit=360)
def settle_evaluation(job_id: int) -> None:
    """Count the results and send the webhook of the evaluation whose job ``job_id`` ended (idempotent)."""
    evaluation_settle(job_id=job_id)


@task(TaskName.EVALUATE_FINAL_CHECKPOINT, soft_time_limit=120, time_limit=180)
def evaluate_final_checkpoint(job_id: int) -> None:
    """Start the evaluation of the final checkpoint of the training job ``job_id`` that succeeded (idempotent)."""
    evaluation_of_final_checkpoint(job_id=job_id)
