"""The local launcher's engine environment (jobs/launchers/local.py): an allow-list, never the
worker's secrets."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from jobs.launchers.base import LaunchRequest
from jobs.launchers.local import LocalLauncher, engine_environment
from tests.support.local_launcher import (
    REPO,
    engine_stand_in,  # noqa: F401  (a fixture)
)

#: What a worker's environment holds besides what the engine needs (docs/configuration.md).
WORKER_SECRETS = {
    "SECRET_KEY": "django-insecure-signs-job-tokens",
    "SECRET_KEY_FILE": "/run/secrets/secret-key",
    "DATABASE_URL": "postgres://lab:hunter2@db:5432/lab",
    "DATABASE_URL_FILE": "/run/secrets/database-url",
    "REDIS_URL": "redis://:hunter2@redis:6379/0",
    "CELERY_BROKER_URL": "redis://:hunter2@redis:6379/1",
    "STRIPE_API_KEY": "sk_live_123",
    "STRIPE_WEBHOOK_SECRET": "whsec_stripe",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_SESSION_TOKEN": "aws-session",
    "AWS_ENDPOINT_URL": "http://minio:9000",
    "EMAIL_HOST_PASSWORD": "mail-secret",
    "EMAIL_HOST_USER": "lab@example.com",
    "LAB_API_KEY": "lab_operator_key",
    "HF_TOKEN": "hf_operator_token",
    "LAB_ENGINE_SECRET": "not for the engine either",
    "LAB_JOB_TOKEN": "a token of another job",
    "DJANGO_SETTINGS_MODULE": "lab.settings",
}

#: What the engine reads or needs to run (engine/cli.py, engine/catalog.py, torch, transformers).
ENGINE_NEEDS = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/lab",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TMPDIR": "/tmp/lab",
    "LAB_DATA_DIR": "/var/lib/lab",
    "LAB_MODEL_DIR": "/var/lib/lab/models",
    "LAB_ENGINE_THREADS": "1",
    "LAB_ENGINE_ROLLOUT": "transformers",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
    "CUDA_VISIBLE_DEVICES": "0",
}


def test_it_passes_what_the_engine_needs_and_none_of_the_workers_secrets():
    env = engine_environment(token="job-token", repo_dir=Path("/srv/lab"), source={**WORKER_SECRETS, **ENGINE_NEEDS})
    assert env == {
        **ENGINE_NEEDS,
        "LAB_JOB_TOKEN": "job-token",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": "/srv/lab:/srv/lab/sdk",
    }


def test_it_keeps_the_workers_python_path_after_lab_and_the_sdk():
    env = engine_environment(token="t", repo_dir=Path("/srv/lab"), source={"PYTHONPATH": "/opt/extra"})
    assert env["PYTHONPATH"] == "/srv/lab:/srv/lab/sdk:/opt/extra"


def test_it_reads_the_process_environment_by_default(monkeypatch):
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAB_ENGINE_OVERLAP", "0")
    env = engine_environment(token="job-token", repo_dir=REPO)
    assert env["LAB_ENGINE_OVERLAP"] == "0"
    assert env["LAB_JOB_TOKEN"] == "job-token"
    assert sorted(set(WORKER_SECRETS) & set(env)) == ["LAB_JOB_TOKEN"]
    assert not any(value in env.values() for name, value in WORKER_SECRETS.items() if name != "DJANGO_SETTINGS_MODULE")


def test_a_launched_engine_process_sees_none_of_the_workers_secrets(monkeypatch, tmp_path, engine_stand_in):  # noqa: F811
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAB_ENGINE_THREADS", "1")
    launcher = LocalLauncher(runs_dir=tmp_path / "runs", repo_dir=REPO, python=str(engine_stand_in), isolation="none")
    request = LaunchRequest(job_id="job_env", attempt=1, spec={}, lab_url="http://127.0.0.1:9", token="job-token")
    handle = launcher.launch(request)
    workdir = Path(handle["workdir"])
    deadline = time.monotonic() + 30
    while not (workdir / "exit.json").exists():
        assert time.monotonic() < deadline, (workdir / "stderr.log").read_text()
        time.sleep(0.05)
    assert json.loads((workdir / "exit.json").read_text()) == {"exit_code": 0}
    seen = json.loads((workdir / "stdout.log").read_text())
    assert seen["LAB_JOB_TOKEN"] == "job-token"
    assert seen["LAB_ENGINE_THREADS"] == "1"
    assert seen["PATH"] == os.environ["PATH"]
    assert sorted(set(WORKER_SECRETS) & set(seen)) == ["LAB_JOB_TOKEN"]
    assert not any(value in seen.values() for name, value in WORKER_SECRETS.items() if name != "DJANGO_SETTINGS_MODULE")


def test_the_orphan_sweep_spares_an_engine_started_moments_ago_and_ends_an_old_one(tmp_path):
    """The launch task starts the engine before it records the attempt as launched: a sweep in
    between must not take the new engine for an orphan (it did, and killed it)."""
    import signal
    import subprocess

    from jobs.launchers import local

    launcher = LocalLauncher(runs_dir=tmp_path / "runs", repo_dir=REPO, isolation="none")
    engines = {}
    for name in ("young", "old"):
        workdir = tmp_path / "runs" / f"job_{name}" / "attempt-1"
        workdir.mkdir(parents=True)
        engines[name] = subprocess.Popen(["sleep", "300"], start_new_session=True)
        (workdir / "engine.pid").write_text(str(engines[name].pid))
    old_pid_file = tmp_path / "runs" / "job_old" / "attempt-1" / "engine.pid"
    long_ago = time.time() - local.ORPHAN_GRACE_S - 1
    os.utime(old_pid_file, (long_ago, long_ago))
    try:
        assert launcher.sweep_orphans([]) == [str(old_pid_file.parent)]
        assert engines["old"].wait(timeout=10) == -signal.SIGKILL
        assert engines["young"].poll() is None
    finally:
        for engine in engines.values():
            if engine.poll() is None:
                engine.kill()
                engine.wait()
