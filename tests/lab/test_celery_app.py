"""The Celery app ``lab``: a bare ``celery -A lab worker`` consumes every queue tasks are sent to,
registers exactly the tasks ``TaskName`` lists, and routes each to the queue ``TaskName`` gives it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from lab.celery import Queue, TaskName, app

ROOT = Path(__file__).resolve().parents[2]

#: Run in a process of its own, so nothing this test run imported counts: what a web process
#: loads (Django, the ASGI application, every URLconf and view), then what a worker imports at
#: start (``celery -A lab worker`` autodiscovers the task modules).
PROCESSES = """
import json, sys
import django
django.setup()
import lab.asgi
from django.urls import get_resolver
get_resolver().url_patterns
web = sorted(name for name in sys.modules if name.split(".")[0] in {"lab", "jobs", "billing", "environments", "dashboard"} and name.endswith(".tasks"))
from lab.celery import app
app.loader.import_default_modules()
tasks = sorted(name for name in app.tasks if not name.startswith("celery."))
print(json.dumps({"web": web, "worker": tasks}))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    """The task modules a fresh web process loads (``web``) and the tasks a fresh worker registers (``worker``)."""
    result = subprocess.run(
        [sys.executable, "-c", PROCESSES], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_it_declares_every_queue_so_a_bare_worker_consumes_them_all():
    assert [queue.name for queue in app.conf.task_queues] == [queue.value for queue in Queue]


def test_a_worker_registers_exactly_the_tasks_task_name_lists(loaded):
    assert loaded["worker"] == sorted(name.value for name in TaskName)


def test_every_task_is_routed_to_the_declared_queue_its_task_name_gives():
    routed = {name.value: app.amqp.router.route({}, name.value)["queue"].name for name in TaskName}

    assert routed == {
        "jobs.admit": "admission",
        "jobs.launch_attempt": "admission",
        "jobs.reconcile_job": "reconciler",
        "jobs.reconcile": "reconciler",
        "jobs.sweep_orphan_checkpoints": "default",
        "jobs.webhooks.deliver": "webhooks",
        "jobs.webhooks.sweep": "webhooks",
        "billing.send_meter_events": "billing",
        "lab.purge_idempotency_records": "default",
        "environments.build": "builds",
        "environments.sweep_builds": "default",
        "jobs.check_model": "builds",
        "jobs.sweep_model_builds": "default",
        "sandboxes.reap": "default",
        "sandboxes.expire_logs": "default",
        "serving.reconcile": "reconciler",
        "evaluations.settle": "default",
        "evaluations.evaluate_final_checkpoint": "default",
    }
    assert set(routed.values()) <= {queue.name for queue in app.conf.task_queues}


def test_a_web_process_loads_no_task_module(loaded):
    assert loaded["web"] == []


def test_beat_schedules_tasks_by_their_task_names():
    scheduled = sorted(entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values())

    assert scheduled == sorted(
        [
            TaskName.SEND_METER_EVENTS,
            TaskName.RECONCILE,
            TaskName.SWEEP_ORPHAN_CHECKPOINTS,
            TaskName.SWEEP_WEBHOOKS,
            TaskName.PURGE_IDEMPOTENCY_RECORDS,
            TaskName.SWEEP_ENVIRONMENT_BUILDS,
            TaskName.SWEEP_MODEL_BUILDS,
            TaskName.REAP_SANDBOXES,
            TaskName.EXPIRE_SANDBOX_LOGS,
            TaskName.RECONCILE_SERVING,
        ]
    )
