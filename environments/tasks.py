"""Celery tasks of environment packages: thin wrappers over ``environments.builds``."""

from __future__ import annotations

from django.conf import settings

from environments import builds, hub, pod_builds
from lab.celery import TaskName, task

_BUILD_TIMEOUT_S = settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S


@task(TaskName.BUILD_ENVIRONMENT, soft_time_limit=_BUILD_TIMEOUT_S + builds.TASK_GRACE_S - 60, time_limit=_BUILD_TIMEOUT_S + builds.TASK_GRACE_S)
def build_environment(build_id: int) -> None:
    """Run the queued environment build ``build_id`` (a no-op once it has run): as the worker's
    subprocess, or as a Job on the cluster of ``LAB_LAUNCHER`` (``environments.pod_builds``)."""
    cluster = pod_builds.cluster()
    if cluster is None:
        builds.build_run(build_id)
    else:
        pod_builds.pod_build_start(build_id, cluster)


@task(TaskName.SWEEP_ENVIRONMENT_BUILDS, soft_time_limit=120, time_limit=180)
def sweep_environment_builds() -> dict[str, int]:
    """Periodic pass: end the builds whose Job ended (on a cluster), fail builds a lost worker
    left running, send long-queued ones again, and delete wheels staged by hub uploads that were
    never finalized."""
    cluster = pod_builds.cluster()
    if cluster is None:
        return {**builds.build_sweep(), "staged_deleted": hub.hub_uploads_sweep()}
    ended = pod_builds.pod_build_sweep(cluster)
    return {**ended, **builds.build_sweep(running_grace_s=pod_builds.RUNNING_GRACE_S), "staged_deleted": hub.hub_uploads_sweep()}
