"""Periodic housekeeping tasks of the lab app."""

from __future__ import annotations

from lab.celery import TaskName, task
from lab.idempotency import purge_expired_idempotency_records


@task(TaskName.PURGE_IDEMPOTENCY_RECORDS, soft_time_limit=60, time_limit=90)
def purge_idempotency_records() -> int:
    """Delete Idempotency-Key answers older than 24 hours; return how many went."""
    return purge_expired_idempotency_records()
