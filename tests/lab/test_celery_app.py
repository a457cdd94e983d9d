"""The Celery app ``lab``: a bare ``celery -A lab worker`` consumes every queue tasks are sent to."""

from __future__ import annotations

import django

from lab.celery import Queue, app


def test_it_declares_every_queue_so_a_bare_worker_consumes_them_all():
    assert [queue.name for queue in app.conf.task_queues] == [queue.value for queue in Queue]


def test_every_task_is_sent_to_a_declared_queue():
    django.setup()
    app.loader.import_default_modules()
    declared = {queue.name for queue in app.conf.task_queues}
    routed = {name: (task.queue or app.conf.task_default_queue) for name, task in app.tasks.items() if not name.startswith("celery.")}
    assert routed and {name: queue for name, queue in routed.items() if queue not in declared} == {}
