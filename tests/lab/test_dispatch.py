"""Producers send tasks by name through ``lab.dispatch``, on commit, and never import a task module."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from lab import dispatch
from lab.celery import TaskName, app
from lab.models import IdempotencyRecord

ROOT = Path(__file__).resolve().parents[2]

#: The server's packages: the ones with Celery task modules and the producers of their tasks.
SERVER_PACKAGES = ("lab", "jobs", "billing", "environments", "dashboard")
#: The composition root may name every module (docs/architecture.md "Layout").
COMPOSITION_ROOT = {"lab/settings.py", "lab/urls.py", "lab/asgi.py", "lab/wsgi.py", "lab/celery.py"}
#: Calls whose first argument is a dotted module path imported at run time.
DYNAMIC_IMPORTS = {"import_module", "import_string"}


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    """Record what would reach the broker, as ``(name, args, countdown)``, instead of sending it
    (``TaskName`` routes each name to its queue: tests/lab/test_celery_app.py)."""
    messages: list[tuple] = []

    def send_task(name, *, args, countdown):
        messages.append((name, args, countdown))

    monkeypatch.setattr(app, "send_task", send_task)
    return messages


@pytest.mark.django_db
def test_it_sends_a_task_by_name_once_the_transaction_commits(sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        dispatch.enqueue_on_commit(TaskName.LAUNCH_ATTEMPT, 42)
        assert sent == []

    assert len(callbacks) == 1
    assert sent == [("jobs.launch_attempt", (42,), None)]


@pytest.mark.django_db
def test_it_sends_nothing_when_the_transaction_rolls_back(sent, django_capture_on_commit_callbacks):
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        dispatch.enqueue_on_commit(TaskName.RECONCILE_JOB, 7)
        raise RuntimeError("rolled back")

    assert callbacks == []
    assert sent == []


def test_send_waits_the_countdown_in_the_queue(sent):
    dispatch.send(TaskName.DELIVER_WEBHOOKS, [3, 4], countdown=300.0)

    assert sent == [("jobs.webhooks.deliver", ([3, 4],), 300.0)]


def test_with_celery_task_always_eager_the_task_runs_in_this_process(owner, sent, monkeypatch):
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    old = IdempotencyRecord.objects.create(
        project=owner.project, key="old", request_hash="0" * 64, status_code=201, response_body={},
        created_at=timezone.now() - timedelta(days=2),
    )
    fresh = IdempotencyRecord.objects.create(
        project=owner.project, key="fresh", request_hash="0" * 64, status_code=201, response_body={}
    )

    dispatch.send(TaskName.PURGE_IDEMPOTENCY_RECORDS)

    assert sent == []
    assert list(IdempotencyRecord.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert not IdempotencyRecord.objects.filter(pk=old.pk).exists()


def _imported(node: ast.AST, package: list[str]) -> list[str]:
    """Return the dotted names an import node (or a dynamic import call) reads, relative ones
    resolved against ``package``, the dotted parts of the importing module's package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = package[: len(package) - node.level + 1] if node.level else []
        source = ".".join([*base, *([node.module] if node.module else [])])
        return [source, *(f"{source}.{alias.name}" for alias in node.names)]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name in DYNAMIC_IMPORTS and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def task_module_imports(root: Path) -> list[str]:
    """Return ``"path:line: imports module"`` for every import of a ``tasks`` module (inside
    functions too) by a server module that is neither a task module nor the composition root."""
    problems = []
    for package in SERVER_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if path.name == "tasks.py" or relative.as_posix() in COMPOSITION_ROOT:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found = set()
            for node in ast.walk(tree):
                for name in _imported(node, list(relative.parts[:-1])):
                    if name.split(".")[0] in SERVER_PACKAGES and "tasks" in name.split("."):
                        found.add((node.lineno, name))
                        break
            problems += [f"{relative.as_posix()}:{line}: imports {name}" for line, name in sorted(found)]
    return problems


def test_no_module_but_the_task_modules_and_the_composition_root_imports_a_task_module():
    assert task_module_imports(ROOT) == []


def test_the_walk_finds_every_form_of_import_of_a_task_module(tmp_path):
    files = {
        "jobs/__init__.py": "",
        "jobs/tasks.py": "from jobs.webhooks import tasks\n",
        "jobs/services.py": "import os\n\ndef later():\n    from jobs import tasks\n",
        "jobs/webhooks/__init__.py": "from . import tasks as _tasks\n",
        "jobs/webhooks/outbox.py": "from .tasks import deliver\nfrom ..models import Job\n",
        "billing/metering.py": "import billing.tasks\nfrom celery import Task\n",
        "dashboard/views.py": "from importlib import import_module\nimport_module('jobs.tasks')\n",
        "lab/celery.py": "from jobs import tasks\n",
    }
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)

    assert task_module_imports(tmp_path) == [
        "jobs/services.py:4: imports jobs.tasks",
        "jobs/webhooks/__init__.py:1: imports jobs.webhooks.tasks",
        "jobs/webhooks/outbox.py:1: imports jobs.webhooks.tasks",
        "billing/metering.py:1: imports billing.tasks",
        "dashboard/views.py:2: imports jobs.tasks",
    ]
