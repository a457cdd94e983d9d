"""Celery tasks of sandboxes: thin over ``sandboxes.services``."""

from __future__ import annotations

from lab.celery import TaskName, task
from sandboxes.services import sandbox_reap_expired


@task(TaskName.REAP_SANDBOXES, soft_time_limit=240, time_limit=300)
def reap_sandboxes() -> int:
    """Stop the sandboxes past their lifetime and delete their files (beat, every 30 s)."""
    return sandbox_reap_expired()
