"""Nothing lost when Lab's web server goes away mid-run: web, a Celery worker, the local launcher
and the engine on the tiny model, 60 steps with ``checkpoints = {interval = 10, keep_last = 2}``.

The web server is stopped while the job trains and stays away longer than ``keep_last ×
interval`` steps, so the engine's local retention runs while uploads are owed. Once with the
web server back before the engine finishes (the engine delivers everything itself), once only
after the engine has exited (Lab's worker, restarted, delivers the rest from the attempt's spool). Either way every
step is stored, every checkpoint is ``ready`` or (retention) ``deleted``, the final one is
``ready`` and the job ends ``succeeded`` without a ``job.data_incomplete`` warning.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from django.db import connection

from jobs.models import Checkpoint, Job, JobEvent, MetricStep
from jobs.serializers import job_to_dict
from tests.support.live import _spooled_steps
from tests.support.stack import LabStack, running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

STEPS = 60
SPEC = {
    "model": "lab/tiny-random-llama",
    "max_steps": STEPS,
    "batch_size": 4,
    "rollouts_per_example": 2,
    "learning_rate": 1e-2,
    "lora_rank": 4,
    "lora_alpha": 8,
    "seed": 5,
    "sampling": {"max_tokens": 4},
    "env": [{"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 3}}],
    "checkpoints": {"interval": 10, "keep_last": 2},
    "eval": {"interval": 0},
}


@pytest.fixture
def stack(tmp_path, settings):
    # A short flush at exit, so the second test's engine gives up on the absent web server soon.
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_THREADS="1", LAB_ENGINE_FLUSH_TIMEOUT="3") as lab:
        yield lab


def _submit(stack: LabStack, key: str) -> tuple[str, Path]:
    answer = httpx.post(f"{stack.base_url}/api/v1/jobs", headers={"Authorization": f"Bearer {key}"}, json=SPEC, timeout=30)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    return job_id, stack.data_dir / "runs" / job_id / "attempt-1"


def _assert_nothing_lost(stack: LabStack, job_id: str) -> None:
    job = wait_for(
        lambda: (j := Job.objects.unscoped().get(public_id=job_id)).is_terminal and j, timeout=300, what=f"{job_id} finished"
    )
    assert job.status == "succeeded", f"{job.error_code} {job.error_message}\n{stack.logs()}"
    steps = list(MetricStep.objects.filter(job=job).order_by("step").values_list("step", flat=True))
    assert steps == list(range(1, STEPS + 1)), stack.logs()
    checkpoints = dict(Checkpoint.objects.unscoped().filter(job=job).values_list("step", "status"))
    assert checkpoints == {
        **{step: "deleted" for step in range(10, STEPS - 10, 10)},
        STEPS - 10: "ready",
        STEPS: "ready",
    }, stack.logs()
    assert job_to_dict(job)["latest_checkpoint"]["step"] == STEPS
    assert not JobEvent.objects.filter(job=job, type="job.data_incomplete").exists()


def test_it_stores_every_step_and_checkpoint_across_a_web_outage_mid_run(stack, owner):
    job_id, attempt_dir = _submit(stack, owner.key)
    wait_for(lambda: _spooled_steps(attempt_dir) >= 19, timeout=240, what="step 19")
    stack.kill("web")  # at once: a graceful shutdown would let the engine finish its reports
    outage_from = _spooled_steps(attempt_dir)
    # Longer than keep_last × interval = 20 steps: retention runs while uploads are owed.
    wait_for(lambda: _spooled_steps(attempt_dir) >= outage_from + 25, timeout=240, what="25 steps without Lab")
    stack.start_web()
    _assert_nothing_lost(stack, job_id)


def test_it_delivers_from_the_spool_what_the_engine_could_not_before_it_exited(stack, owner):
    job_id, attempt_dir = _submit(stack, owner.key)
    wait_for(lambda: _spooled_steps(attempt_dir) >= 15, timeout=240, what="step 15")
    stack.kill("web")  # at once: a graceful shutdown would let the engine finish its reports
    # The worker goes too, so nothing moves the spool's cursor on until the check below (its
    # delivery of an exited engine's spool could otherwise come first); the engine, detached
    # under its supervisor, trains to the end and exits with steps and checkpoints still spooled.
    stack.kill("worker")
    wait_for(lambda: (attempt_dir / "exit.json").exists(), timeout=300, what="the engine's exit")
    cursor = attempt_dir / "spool" / "attempt-1" / "metrics.sent"
    assert int(cursor.read_text() if cursor.exists() else 0) < STEPS  # something was left to deliver
    stack.start_worker()
    _assert_nothing_lost(stack, job_id)  # the worker delivers it; the web server is still down
