"""Celery tasks of serving: thin over ``serving.servers``."""

from __future__ import annotations

from django.core.cache import cache

from lab import dispatch
from lab.celery import TaskName, task
from serving.servers import reconcile

#: A pass that leaves something in motion sends the next one after this many seconds.
FOLLOW_UP_S = 1.0


@task(TaskName.RECONCILE_SERVING, soft_time_limit=240, time_limit=300)
def reconcile_serving() -> None:
    """Make one serving pass (``serving.servers.reconcile``); while a deployment is pending or a
    server starts or stops, send one follow-up pass a second later (one at a time: a cache key)."""
    if reconcile() and cache.add("serving:reconcile-follow-up", 1, timeout=FOLLOW_UP_S):
        dispatch.send(TaskName.RECONCILE_SERVING, countdown=FOLLOW_UP_S)
