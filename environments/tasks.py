"""Celery tasks of environment packages: thin wrappers over ``environments.builds``."""

from __future__ import annotations

from environments import builds
from lab.celery import TaskName, task


@task(TaskName.BUILD_ENVIRONMENT, soft_time_limit=builds.BUILD_TIMEOUT_S + 120, time_limit=builds.BUILD_TIMEOUT_S + 180)
def build_environment(build_id: int) -> None:
    """Run the queued environment build ``build_id`` (a no-op once it has run)."""
    builds.build_run(build_id)
