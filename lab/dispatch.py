"""Send Lab's Celery tasks by name, once the transaction that wrote what they read commits.

Producers (services, the ingest API, the reconciler, the webhook outbox, billing) call
``enqueue_on_commit(TaskName.X, *ids)`` and never import a task module, as Zulip's
``queue_event_on_commit`` names a queue and never its worker: the task is sent by its registered
name to the queue ``TaskName`` gives it, so a task never runs before its rows are committed, and
never at all when the transaction rolls back. The worker and beat register the tasks
(``lab.celery``); no other process needs them.
"""

from __future__ import annotations

from celery import Task
from django.db import transaction

from lab.celery import TaskName, app


def enqueue_on_commit(name: TaskName, *args: object) -> None:
    """Send the task ``name`` with the positional ``args`` (JSON values: ids, lists of ids) once
    the current transaction commits; nothing is sent if it rolls back. Outside a transaction it
    is sent at once."""
    transaction.on_commit(lambda: send(name, *args))


def send(name: TaskName, *args: object, countdown: float | None = None) -> None:
    """Send the task ``name`` with the positional ``args`` to its queue now, to run after
    ``countdown`` seconds (at once when None).

    For code that already runs after its commit (an on-commit flush, a task, a periodic sweep);
    anything else uses ``enqueue_on_commit``. With ``CELERY_TASK_ALWAYS_EAGER`` the task runs
    here, in this process, as ``Task.delay`` would run it.
    """
    if app.conf.task_always_eager:
        _registered(name).apply(args)
        return
    app.send_task(name.value, args=args, countdown=countdown)


def _registered(name: TaskName) -> Task:
    """Return the task registered as ``name``, importing the task modules as a worker does first
    if this process has not."""
    if name not in app.tasks:
        app.loader.import_default_modules()
    return app.tasks[name]
