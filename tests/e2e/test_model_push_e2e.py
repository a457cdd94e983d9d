"""End to end: a model directory pushed through the SDK is checked by the real Celery worker (in
bubblewrap, never in the web process), then a job of its organization trains it on the local
launcher, its engine fetching the files from Lab's model store; another organization's job
naming it is refused as naming a missing model."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from labsdk import InvalidSpecError, Lab

from jobs.models import ModelBuild
from jobs.registry import builds
from jobs.registry.builds import build_sweep
from jobs.registry.store import KEY_PREFIX
from lab import storage
from tests.support.environments import wait_finished
from tests.support.model_dirs import tiny_model_directory
from tests.support.packages import TINY
from tests.support.stack import ROOT, running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1") as lab:
        yield lab


def test_a_pushed_model_is_checked_by_the_worker_and_trains_its_organizations_job(stack, owner, outsider, tmp_path):
    directory = tiny_model_directory(tmp_path / "model")
    # The stack's engines share this machine's model cache: no earlier run may have fetched the model.
    cache = Path(os.environ.get("LAB_MODEL_DIR", str(ROOT / "var" / "models"))) / ".store" / "acme" / "tiny-qwen3"
    shutil.rmtree(cache, ignore_errors=True)
    spec = {**TINY, "model": "acme/tiny-qwen3", "env": [{"id": "lab/addition", "args": {"max_operand": 9}}]}
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        pushed = lab.models.push(directory, name="acme/tiny-qwen3")
        assert pushed.build.status in {"queued", "running"}
        model = lab.models.wait("acme/tiny-qwen3", timeout=180, poll_interval=1)
        assert (model.status, model.architecture, model.parameters) == ("ready", "qwen3", 80_576), stack.logs()
        job = lab.jobs.create(spec)
        done = wait_finished(lab, stack, job.id)
        assert done.status == "succeeded", f"{done.to_dict()}\n{stack.logs()}"
        assert [point.step for point in lab.jobs.metrics(job.id) if "loss/mean" in point.values] == [1, 2]
    fetched = cache / model.revision
    assert sorted(path.name for path in fetched.iterdir()) == sorted(path.name for path in directory.iterdir())
    with Lab(api_key=outsider.key, base_url=stack.base_url, timeout=30) as theirs:
        with pytest.raises(InvalidSpecError) as refused:
            theirs.jobs.create(spec)
    assert refused.value.errors[0].code == "unknown_model"


def descendants(pid: int) -> set[int]:
    """The processes below ``pid`` (children, their children, ...), from ``ps``."""
    listed = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True, check=True).stdout.split()
    children: dict[int, list[int]] = {}
    for child, parent in zip(listed[::2], listed[1::2]):
        children.setdefault(int(parent), []).append(int(child))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running_check(stack) -> set[int]:
    """The worker's processes running a model check (bubblewrap and the check in it), once the build is running."""
    if not ModelBuild.objects.unscoped().filter(status="running").exists():
        return set()
    checks = set(subprocess.run(["pgrep", "-f", "engine.model_check"], capture_output=True, text=True).stdout.split())
    return {pid for pid in descendants(stack.processes["worker"].pid) if str(pid) in checks}


def test_a_worker_killed_mid_check_leaves_nothing_half_stored_and_the_sweep_fails_it_so_a_push_again_passes(stack, owner, tmp_path, settings):
    """The worker is killed with SIGKILL while its check runs: the check (in bubblewrap) dies with
    it, nothing of the model is stored, beat's sweep fails the build once its limit has passed and
    deletes the pushed archive, and the same push again, to a restarted worker, passes."""
    directory = tiny_model_directory(tmp_path / "model")
    settings.STORAGES = {**settings.STORAGES, "checkpoints": {  # the stack's object store, read from here
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(stack.data_dir / "checkpoints")}}}
    organization = owner.organization.public_id
    with Lab(api_key=owner.key, base_url=stack.base_url, timeout=30) as lab:
        lab.models.push(directory, name="acme/killed-check")
        checking = wait_for(lambda: running_check(stack), timeout=120, interval=0.05, what="a running check")
        stack.kill("worker")
        wait_for(lambda: not {pid for pid in checking if Path(f"/proc/{pid}").exists()}, timeout=15, what="the check gone with its worker")
        build = ModelBuild.objects.unscoped().get(model_id="acme/killed-check")
        assert build.status == "running" and lab.models.get("acme/killed-check").status == "checking"
        stored = [key for key, _ in storage.iter_objects(KEY_PREFIX) if "/uploads/" not in key]
        assert stored == [], stored  # the check died before storing anything of the model

        # Beat's sweep, once the check's limit and the task's grace have passed (the clock moved on).
        ModelBuild.objects.unscoped().filter(pk=build.pk).update(started_at=timezone.now() - timedelta(
            seconds=settings.LAB_MODEL_CHECK_TIMEOUT_S + builds.TASK_GRACE_S + 1))
        assert build_sweep() == {"failed": 1, "resent": 0}
        failed = lab.models.get("acme/killed-check")
        assert (failed.status, failed.build.status) == ("failed", "failed")
        assert "its worker stopped or it hung; push the model again" in failed.build.error
        assert list(storage.iter_objects(f"{KEY_PREFIX}uploads/{organization}/")) == []  # nor the pushed archive kept

        stack.start_worker()
        again = lab.models.push(directory, name="acme/killed-check")
        assert again.build.number == 2
        model = lab.models.wait("acme/killed-check", timeout=180, poll_interval=1)
        assert (model.status, model.build.status, model.parameters) == ("ready", "ready", 80_576), stack.logs()
