"""The Celery application ``lab`` (``celery -A lab worker``) and the queues tasks run on.

Tasks take ids, are idempotent, are enqueued with ``transaction.on_commit``, carry explicit
names and time limits, and name their queue from ``Queue``. Results are never stored.
"""

from __future__ import annotations

import os
from enum import StrEnum

from celery import Celery
from kombu import Queue as KombuQueue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")


class Queue(StrEnum):
    """The Celery queues; a bare ``celery -A lab worker`` consumes all of them (``-Q`` narrows it)."""

    DEFAULT = "default"
    ADMISSION = "admission"
    RECONCILER = "reconciler"
    WEBHOOKS = "webhooks"
    BILLING = "billing"


app = Celery("lab")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue=Queue.DEFAULT.value,
    # Declared, so a worker started without -Q consumes every queue, not only the default one.
    task_queues=[KombuQueue(queue.value) for queue in Queue],
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    timezone="UTC",
)
app.autodiscover_tasks()
