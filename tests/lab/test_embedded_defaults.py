"""Lab on embedded defaults (no DATABASE_URL, no REDIS_URL): SQLite, broker-free Celery, uvicorn.

These start real processes, so the path a new user takes first never rots.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobs.processes import free_port
from lab.celery import Queue

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def embedded_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
    env.update(LAB_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="lab.settings", **extra)
    return env


def manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=check
    )


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.e2e
def test_it_serves_the_api_on_embedded_defaults(tmp_path):
    env = embedded_env(tmp_path)
    manage(env, "migrate", "--noinput")
    assert (tmp_path / "lab.sqlite3").exists()
    created = manage(env, "bootstrap_tenant", "--org", "demo", "--project", "demo", "--email", "demo@example.com")
    key = json.loads(created.stdout.strip().splitlines()[-1])["api_key"]

    port = free_port()
    server = subprocess.Popen(
        [PYTHON, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(f"{base}/healthz"))
        whoami = httpx.get(f"{base}/api/v1/whoami", headers={"Authorization": f"Bearer {key}"})
        assert whoami.status_code == 200
        assert whoami.json()["project"]["slug"] == "demo"
        assert whoami.headers["X-Request-Id"]
        wrong = httpx.get(f"{base}/api/v1/whoami", headers={"Authorization": "Bearer lab_wrongwrongwrongwrongwrong"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        ready = httpx.get(f"{base}/readyz")
        assert ready.status_code == 200, ready.text
    finally:
        stop(server)
    journal = manage(env, "shell", "-c", "from django.db import connection; c = connection.cursor(); "
                     "c.execute('PRAGMA journal_mode'); print(c.fetchone()[0])")
    assert journal.stdout.strip().splitlines()[-1] == "wal"


@pytest.mark.e2e
def test_a_worker_runs_tasks_on_the_broker_free_default(tmp_path):
    env = embedded_env(tmp_path)
    manage(env, "migrate", "--noinput")
    # migrate declared every queue, so web, worker and beat starting together only find them
    # (declaring one is a get-or-create they race on, fatal to a starting worker).
    with contextlib.closing(sqlite3.connect(tmp_path / "celery-broker.sqlite3")) as broker:
        assert {name for (name,) in broker.execute("SELECT name FROM kombu_queue")} == {queue.value for queue in Queue}
    worker = subprocess.Popen(
        [PYTHON, "-m", "celery", "-A", "lab", "worker", "--pool", "solo", "--loglevel", "INFO", "-Q", "default"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        manage(env, "shell", "-c", "from lab.tasks import purge_idempotency_records; purge_idempotency_records.delay()")
        seen: list[str] = []
        deadline = time.monotonic() + 60
        os.set_blocking(worker.stdout.fileno(), False)
        while time.monotonic() < deadline:
            line = worker.stdout.readline()
            if line:
                seen.append(line)
                if "lab.purge_idempotency_records" in line and "succeeded" in line:
                    break
            else:
                time.sleep(0.2)
        else:
            raise AssertionError("the task did not run:\n" + "".join(seen[-30:]))
    finally:
        stop(worker)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_production_like_settings_pass_the_deploy_check(tmp_path):
    env = embedded_env(
        tmp_path,
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="lab.example.com",
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="smtp.example.com",
    )
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_deploy_check_warns_while_mail_goes_to_the_console(tmp_path):
    env = embedded_env(tmp_path, DEBUG="0", SECRET_KEY=secrets.token_urlsafe(64), ALLOWED_HOSTS="lab.example.com")
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING", check=False)
    assert result.returncode == 1
    assert "(lab.W001) EMAIL_BACKEND is Django's console backend" in result.stderr
    assert "System check identified 1 issue (0 silenced)." in result.stderr


@pytest.mark.parametrize(
    "extra",
    [
        {"DEBUG": "0", "ALLOWED_HOSTS": "lab.example.com"},
        {"DEBUG": "0", "SECRET_KEY": "short", "ALLOWED_HOSTS": "lab.example.com"},
        {"DEBUG": "0", "SECRET_KEY": "x" * 60},
        {"LAB_LOCAL_SLOTS": "many"},
        {"LAB_POOL": "[1, 2]"},
        {"LAB_LAUNCHER": "docker"},
        {"LAB_K8S_MODEL_VOLUME": '{"nfs": {}, "hostPath": {}}'},
    ],
)
def test_bad_settings_fail_at_start_up_with_the_variable_named(tmp_path, extra):
    result = manage(embedded_env(tmp_path, **extra), "check", check=False)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
