"""The Celery application ``lab`` (``celery -A lab worker``), the queues tasks run on and the
names of every task Lab registers.

Tasks take ids, are idempotent, carry explicit names and time limits, and are declared with
``task(TaskName.X, ...)``; ``TaskName`` routes each to its queue. Producers send them by that
name through ``lab.dispatch`` (on commit) and never import a task module. Results are never
stored.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Self

from celery import Celery, shared_task
from kombu import Queue as KombuQueue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")


class Queue(StrEnum):
    """The Celery queues; a bare ``celery -A lab worker`` consumes all of them (``-Q`` narrows it)."""

    DEFAULT = "default"
    ADMISSION = "admission"
    RECONCILER = "reconciler"
    WEBHOOKS = "webhooks"
    BILLING = "billing"
    BUILDS = "builds"


class TaskName(StrEnum):
    """Every Celery task Lab registers, by the name it is registered and sent under, with the
    queue it runs on (``TaskName.ADMIT.queue``): the one table of names and routes that the
    ``task`` decorator, producers (``lab.dispatch``) and beat's schedule go by. Plain strings, so
    ``lab`` names no app."""

    queue: Queue

    def __new__(cls, name: str, queue: Queue) -> Self:
        member = str.__new__(cls, name)
        member._value_ = name
        member.queue = queue
        return member

    ADMIT = "jobs.admit", Queue.ADMISSION
    LAUNCH_ATTEMPT = "jobs.launch_attempt", Queue.ADMISSION
    RECONCILE_JOB = "jobs.reconcile_job", Queue.RECONCILER
    RECONCILE = "jobs.reconcile", Queue.RECONCILER
    SWEEP_ORPHAN_CHECKPOINTS = "jobs.sweep_orphan_checkpoints", Queue.DEFAULT
    DELIVER_WEBHOOKS = "jobs.webhooks.deliver", Queue.WEBHOOKS
    SWEEP_WEBHOOKS = "jobs.webhooks.sweep", Queue.WEBHOOKS
    SEND_METER_EVENTS = "billing.send_meter_events", Queue.BILLING
    PURGE_IDEMPOTENCY_RECORDS = "lab.purge_idempotency_records", Queue.DEFAULT
    BUILD_ENVIRONMENT = "environments.build", Queue.BUILDS
    SWEEP_ENVIRONMENT_BUILDS = "environments.sweep_builds", Queue.DEFAULT
    CHECK_MODEL = "jobs.check_model", Queue.BUILDS
    SWEEP_MODEL_BUILDS = "jobs.sweep_model_builds", Queue.DEFAULT
    REAP_SANDBOXES = "sandboxes.reap", Queue.DEFAULT
    EXPIRE_SANDBOX_LOGS = "sandboxes.expire_logs", Queue.DEFAULT
    RECONCILE_SERVING = "serving.reconcile", Queue.RECONCILER
    SETTLE_EVALUATION = "evaluations.settle", Queue.DEFAULT
    EVALUATE_FINAL_CHECKPOINT = "evaluations.evaluate_final_checkpoint", Queue.DEFAULT


def task(name: TaskName, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Register the decorated function as the Celery task ``name`` (routed to ``name.queue``);
    ``options`` are Celery's own (``soft_time_limit``, ``time_limit``, retries)."""
    return shared_task(name=name.value, **options)


app = Celery("lab")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_default_queue=Queue.DEFAULT.value,
    # Declared, so a worker started without -Q consumes every queue, not only the default one.
    task_queues=[KombuQueue(queue.value) for queue in Queue],
    # However a task is sent (by name, .delay, a retry), it goes to the queue TaskName gives it.
    task_routes={name.value: {"queue": name.queue.value} for name in TaskName},
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
# Each app's tasks.py, and the webhook outbox's (a package below jobs), are imported by the
# worker and beat only: producers send by name and need no task registered.
app.autodiscover_tasks()
app.autodiscover_tasks(["jobs.webhooks"])


def declare_queues() -> None:
    """Declare every queue of ``Queue`` on the broker (idempotent).

    ``manage.py migrate`` calls it on the embedded broker (``lab.apps``), before web, worker and
    beat start: kombu's SQLAlchemy transport declares a queue with a get-or-create that processes
    starting together race on (``UNIQUE constraint failed: kombu_queue.name``, fatal to a
    starting worker); once the queues exist each process only finds them."""
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        for queue in app.conf.task_queues:
            queue.bind(channel).declare()
