"""The engine's three roles (`LAB_ENGINE_ROLES=process`, docs/engine.md "Three roles") under the
real stack: web, a Celery worker, the local launcher. One job goes through the web server and the
worker killed and restarted mid-run, then its trainer killed with SIGKILL: its roles go with it,
Lab resumes the job from its checkpoint, and every step, eval and checkpoint arrives."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from django.db import connection

from jobs.models import Checkpoint, Job, JobAttempt, JobEvent, MetricStep
from tests.support.live import TERMINAL, Api, _spooled_steps, alive, engine_pid
from tests.support.stack import running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]

STEPS = 24
SPEC = {
    "model": "lab/tiny-random-llama",
    "max_steps": STEPS,
    "batch_size": 4,
    "rollouts_per_example": 2,
    "learning_rate": 1e-2,
    "lora_rank": 4,
    "lora_alpha": 8,
    "seed": 7,
    "max_off_policy_steps": 2,
    "max_restarts": 2,
    "sampling": {"max_tokens": 4},
    "env": [{"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 3}}],
    "checkpoints": {"interval": 6, "keep_last": 4},
    "eval": {"interval": 6, "num_examples": 4},
}


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_ENGINE_ROLES="process", LAB_ENGINE_THREADS="1") as lab:
        yield lab


def stored_steps(job_id: str) -> int:
    return MetricStep.objects.filter(job__public_id=job_id, values__has_key="loss/mean").count()


def roles_of(stack, job_id: str) -> list[str]:
    listed = subprocess.run(["pgrep", "-f", f"engine (orchestrator|inference) .*{stack.data_dir / 'runs' / job_id}"],
                            capture_output=True, text=True)
    return listed.stdout.split()


def assert_every_step_and_eval_arrived(job_id: str) -> Job:
    job = Job.objects.unscoped().get(public_id=job_id)
    rows = dict(MetricStep.objects.filter(job=job).values_list("step", "values"))
    assert sorted(step for step, values in rows.items() if "loss/mean" in values) == list(range(1, STEPS + 1))
    assert [step for step, values in sorted(rows.items()) if "eval/reverse-text/mean" in values] == [0, 6, 12, 18, 24]  # 0: the base model
    assert dict(Checkpoint.objects.unscoped().filter(job=job, step=STEPS).values_list("step", "status")) == {STEPS: "ready"}
    assert not JobEvent.objects.filter(job=job, type="job.data_incomplete").exists()
    return job


def test_three_roles_lose_nothing_through_an_outage_of_lab_and_a_trainer_killed_with_sigkill(owner, stack):
    """One job through both faults: the web server and the worker killed and restarted mid-run,
    then the trainer killed with SIGKILL once a checkpoint is ready (Lab resumes from it)."""
    api = Api(stack, owner.key)
    job_id = api.create(SPEC)["id"]
    wait_for(lambda: stored_steps(job_id) >= 3, timeout=240, what="step 3")
    first_roles = roles_of(stack, job_id)
    assert first_roles, "the run started no orchestrator or inference role"
    stack.kill("web")
    stack.kill("worker")
    attempt_dir = stack.data_dir / "runs" / job_id / "attempt-1"
    outage_from = _spooled_steps(attempt_dir)
    wait_for(lambda: _spooled_steps(attempt_dir) >= outage_from + 6, timeout=300, what="6 steps without Lab")  # an eval and a checkpoint among them
    stack.start_web()
    stack.start_worker()
    wait_for(
        lambda: Job.objects.unscoped().filter(public_id=job_id, checkpoints__status="ready").exists(),
        timeout=300, what="a ready checkpoint",
    )
    pid = engine_pid(stack, job_id, 1)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), timeout=30, what="the trainer to end")
    wait_for(lambda: not set(first_roles) & set(roles_of(stack, job_id)), timeout=60, what="its roles to end")
    done = api.wait_status(job_id, TERMINAL, timeout=600)
    assert done["status"] == "succeeded", f"{done}\n{stack.logs()}"
    assert done["attempt"] == 2
    resumed_from = JobAttempt.objects.get(job__public_id=job_id, number=2).resume_from
    assert resumed_from is not None
    assert_every_step_and_eval_arrived(job_id)
    rows = MetricStep.objects.filter(job__public_id=job_id, step__gt=resumed_from.step)
    assert all(row.attempt == 2 for row in rows)
    wait_for(lambda: not roles_of(stack, job_id), timeout=60, what="the roles to end")
