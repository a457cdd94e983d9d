"""Jobs run for real: web, a Celery worker with beat, the local launcher and the engine on the
tiny model, against PostgreSQL and Redis. Reliability cases from the run-pipeline issue."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection
from labsdk import Lab

from jobs.models import Job, JobAttempt, JobEvent, MetricStep
from tests.support.live import TERMINAL, Api, alive, engine_pid
from tests.support.stack import ROOT, LabStack, running_stack, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("default_prices"),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the stack shares a PostgreSQL test database"),
]


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_STOP_GRACE_S="2", LAB_KILL_GRACE_S="5") as lab:
        yield lab


def test_a_job_created_with_the_sdk_runs_to_succeeded_with_every_step_stored_once(owner, stack):
    lab = Lab(api_key=owner.key, base_url=stack.base_url)
    created = lab.jobs.create(spec_file=ROOT / "examples" / "addition-tiny.toml")
    assert created.status == "queued"
    finished = lab.jobs.wait(created.id, timeout=240, progress=False)
    assert finished.status == "succeeded"
    api = Api(stack, owner.key)
    job = {"id": created.id}
    done = api.get(created.id)
    assert done["attempt"] == 1
    assert done["step"] == 3
    assert done["usage"]["cpu_seconds"] > 0
    assert done["latest_checkpoint"]["status"] == "ready"
    assert done["latest_checkpoint"]["step"] == 3
    steps = list(MetricStep.objects.filter(job__public_id=job["id"]).order_by("step").values_list("step", "attempt"))
    # Step 0 is the base model's eval (the example's [eval] interval = 3, skip_first_step left out).
    assert steps == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert set(MetricStep.objects.get(job__public_id=job["id"], step=0).values) == {
        "eval/addition/mean", "eval/addition/correct/mean", "eval/addition/answer_only/mean",
    }
    values = MetricStep.objects.get(job__public_id=job["id"], step=3).values
    assert {"reward/mean", "loss/mean", "time/step", "eval/addition/mean", "filter/zero_advantage/fraction"} <= set(values)
    types = list(JobEvent.objects.filter(job__public_id=job["id"]).order_by("id").values_list("type", flat=True))
    assert types[:3] == ["job.queued", "job.starting", "job.started"]
    assert types[-1] == "job.succeeded"
    assert "checkpoint.ready" in types
    logs = api.client.get(f"/jobs/{job['id']}/logs?limit=1000").json()["data"]
    assert logs, "no log lines were stored"
    step_lines = [line for line in logs if "step 1/3" in line["line"]]
    assert len(step_lines) == 1, step_lines  # the engine's record, not doubled by the launcher
    samples = api.client.get(f"/jobs/{job['id']}/samples").json()["data"]
    assert samples and {"prompt", "completion", "reward", "advantage"} <= set(samples[0])


def test_a_killed_engine_resumes_from_its_checkpoint_and_succeeds(owner, spec, stack):
    spec.update(max_steps=6, checkpoints={"interval": 2, "keep_last": 3}, max_restarts=2)
    api = Api(stack, owner.key)
    job_id = api.create(spec)["id"]
    wait_for(
        lambda: Job.objects.unscoped().filter(public_id=job_id, checkpoints__status="ready").exists(),
        timeout=180,
        what="a ready checkpoint",
    )
    pid = engine_pid(stack, job_id, 1)
    os.kill(pid, signal.SIGKILL)
    done = api.wait_status(job_id, TERMINAL, timeout=240)
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2
    types = list(JobEvent.objects.filter(job__public_id=job_id).order_by("id").values_list("type", flat=True))
    assert "job.requeued" in types
    resumed_from = JobAttempt.objects.get(job__public_id=job_id, number=2).resume_from
    assert resumed_from is not None
    rows = list(MetricStep.objects.filter(job__public_id=job_id).order_by("step").values_list("step", "attempt"))
    assert [step for step, _ in rows] == [1, 2, 3, 4, 5, 6]
    assert all(attempt == 2 for step, attempt in rows if step > resumed_from.step)


def test_cancel_while_queued_and_while_running_frees_the_slot(owner, spec, stack):
    spec.update(max_steps=5000)  # far more than can finish before the cancel lands
    api = Api(stack, owner.key)
    running = api.create(spec)["id"]
    queued = api.create(spec)["id"]  # LAB_LOCAL_SLOTS = 1: this one waits
    api.wait_status(running, {"running"})
    assert api.get(queued)["status"] == "queued"
    assert api.client.post(f"/jobs/{queued}/cancel").json()["status"] == "cancelled"
    assert api.client.post(f"/jobs/{running}/cancel").json()["status"] == "cancelling"
    done = api.wait_status(running, TERMINAL, timeout=120)
    assert done["status"] == "cancelled", done
    pid = engine_pid(stack, running, 1)
    wait_for(lambda: not alive(pid), timeout=30, what="the engine process to end")
    follower = api.create(dict(spec, max_steps=1))["id"]
    assert api.wait_status(follower, TERMINAL)["status"] == "succeeded"


def test_local_slots_bound_running_jobs(owner, spec, tmp_path, settings):
    lab = LabStack(tmp_path / "lab2", LAB_LOCAL_SLOTS="2")
    settings.LAB_DATA_DIR = lab.data_dir
    settings.LAB_LOCAL_SLOTS = 2
    try:
        lab.start()
        api = Api(lab, owner.key)
        spec["max_steps"] = 2
        job_ids = [api.create(spec)["id"] for _ in range(4)]
        most_active = 0
        positions_seen = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            # One list request reads every job in one query: a consistent snapshot.
            listed = {job["id"]: job for job in api.client.get("/jobs", params={"limit": 100}).json()["data"]}
            jobs = [listed[job_id] for job_id in job_ids]
            active = sum(job["status"] in {"starting", "running", "cancelling"} for job in jobs)
            most_active = max(most_active, active)
            positions_seen.append([job["queue_position"] for job in jobs])
            if all(job["status"] in TERMINAL for job in jobs):
                break
            time.sleep(0.5)
        assert [job["status"] for job in jobs] == ["succeeded"] * 4, lab.logs()
        assert most_active <= 2
        last_queued = [positions[3] for positions in positions_seen if positions[3] is not None]
        assert last_queued and last_queued == sorted(last_queued, reverse=True)
    finally:
        lab.stop()


def test_a_killed_worker_launches_the_job_exactly_once_after_restart(owner, spec, stack):
    stack.kill("worker")
    api = Api(stack, owner.key)
    job_id = api.create(spec)["id"]
    stack.start_worker()
    assert api.wait_status(job_id, TERMINAL)["status"] == "succeeded"
    assert JobAttempt.objects.filter(job__public_id=job_id).count() == 1
    assert len(list((stack.data_dir / "runs" / job_id).glob("attempt-*"))) == 1


def test_cancel_while_starting_ends_cancelled(owner, spec, stack):
    api = Api(stack, owner.key)
    job_id = api.create(dict(spec, max_steps=50))["id"]
    api.wait_status(job_id, {"starting"}, timeout=30)
    assert api.client.post(f"/jobs/{job_id}/cancel").json()["status"] == "cancelling"
    assert api.wait_status(job_id, TERMINAL, timeout=120)["status"] == "cancelled"
    pid = engine_pid(stack, job_id, 1)
    if pid is not None:
        wait_for(lambda: not alive(pid), timeout=30, what="the engine process to end")


def test_an_engine_that_exits_2_is_not_retried(owner, spec, stack):
    # Valid JSON types, but the environment refuses the combination: the engine exits 2.
    spec["env"][0]["args"] = {"min_operand": 50, "max_operand": 9}
    api = Api(stack, owner.key)
    job_id = api.create(spec)["id"]
    done = api.wait_status(job_id, TERMINAL)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "environment_error"
    assert "min_operand" in done["error"]["message"]
    assert done["attempt"] == 1
    assert JobAttempt.objects.filter(job__public_id=job_id).count() == 1


def test_an_engine_that_crashes_every_time_fails_after_max_restarts(owner, spec, tmp_path, settings):
    model_dir = tmp_path / "models"
    broken = model_dir / "broken" / "no-tokenizer"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text(
        '{"model_type": "llama", "max_position_embeddings": 512, "vocab_size": 100, "hidden_size": 16,'
        ' "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32}'
    )
    lab = LabStack(tmp_path / "lab3", LAB_MODEL_DIR=str(model_dir))
    settings.LAB_DATA_DIR = lab.data_dir
    try:
        lab.start()
        api = Api(lab, owner.key)
        job_id = api.create(dict(spec, model="broken/no-tokenizer", max_restarts=1))["id"]
        done = api.wait_status(job_id, TERMINAL, timeout=240)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "max_restarts_exceeded"
        assert done["attempt"] == 2
        # The error names the traceback's exception (its last lines, made one), which the job's log
        # holds whole, and the command that shows it.
        logs = [line["line"] for line in api.client.get(f"/jobs/{job_id}/logs?limit=1000").json()["data"]]
        traceback = logs[len(logs) - 1 - logs[::-1].index("Traceback (most recent call last):"):]
        exception = " ".join(next(line for line in traceback[1:] if not line.startswith(" ")).split())
        assert exception.startswith("ValueError: Couldn't instantiate the backend tokenizer"), traceback[-3:]
        message = done["error"]["message"]
        assert message.startswith(f"The engine crashed 2 times (exit 1): {exception}"), message
        assert message.endswith(f"; the traceback: lab jobs logs {job_id}"), message
        types = list(JobEvent.objects.filter(job__public_id=job_id).order_by("id").values_list("type", flat=True))
        assert types.count("job.requeued") == 1
        assert types[-1] == "job.failed"
    finally:
        lab.stop()


def test_points_sent_while_lab_is_unreachable_arrive_when_it_returns(owner, spec, stack):
    # Enough steps that the engine is still training when Lab goes away, however fast it runs.
    steps = 200
    spec.update(max_steps=steps, checkpoints={"interval": 0, "keep_last": 1})
    api = Api(stack, owner.key)
    job_id = api.create(spec)["id"]
    wait_for(lambda: MetricStep.objects.filter(job__public_id=job_id).exists(), timeout=180, what="a first step")
    stack.kill("web")
    time.sleep(15)
    assert MetricStep.objects.filter(job__public_id=job_id).count() < steps
    stack.start_web()
    api = Api(stack, owner.key)
    done = api.wait_status(job_id, TERMINAL, timeout=180)
    assert done["status"] == "succeeded", done
    rows = list(MetricStep.objects.filter(job__public_id=job_id).order_by("step").values_list("step", flat=True))
    assert rows == list(range(1, steps + 1))
