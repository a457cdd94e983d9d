"""A job on `lab/python-code` run for real (web, a Celery worker with beat, the local launcher and
the engine in its own sandbox, the session's sandbox agent): its rollouts, or an evaluation's
samples, are scored in sandboxes of the job's attempt, billed to the job, and none outlives the
attempt, also when the engine is killed with SIGKILL; a restart of web and of the worker while it
trains loses no step and leaves no sandbox. One stack for the module."""

from __future__ import annotations

import os
import signal

import pytest
from labsdk import Lab

from billing.models import Meter, UsageInterval
from evaluations.models import Evaluation
from jobs.evaluation_samples import EvaluationSample
from jobs.models import AttemptState, JobAttempt, JobKind, MetricStep
from lab.models import AuditLogEntry
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from tests.support.live import TERMINAL, Api, engine_pid
from tests.support.stack import STACK_TEST_MARKS, LabStack, wait_for

pytestmark = STACK_TEST_MARKS


@pytest.fixture(scope="module")
def code_stack(tmp_path_factory, django_db_setup, agent) -> LabStack:
    lab = LabStack(
        tmp_path_factory.mktemp("code") / "lab", LAB_ENGINE_THREADS="1", LAB_STOP_GRACE_S="2", LAB_KILL_GRACE_S="5",
        LAB_SANDBOX_AGENT_URL=agent.url, LAB_SANDBOX_DATA_PLANE_URL=agent.url, LAB_SANDBOX_AGENT_SECRET=agent.secret,
    )
    try:
        yield lab.start()
    finally:
        lab.stop()


@pytest.fixture
def stack(code_stack, settings) -> LabStack:
    settings.LAB_DATA_DIR = code_stack.data_dir
    return code_stack


def _code_spec(spec: dict, **changes) -> dict:
    spec.update(
        name="python-code-tiny", max_steps=2, batch_size=4, rollouts_per_example=2, sampling={"max_tokens": 16},
        env=[{"id": "lab/python-code", "args": {"num_tests": 2, "timeout_s": 5.0}}],
    )
    spec.update(changes)
    return spec


def _held(runtime) -> frozenset[str]:
    return runtime.held()[1]


def test_a_tiny_model_trains_on_the_code_environment_with_its_rollouts_scored_in_sandboxes(owner, spec, stack, runtime):
    api = Api(stack, owner.key)
    job_id = api.create(_code_spec(spec))["id"]
    done = api.wait_status(job_id, TERMINAL, timeout=300)
    assert done["status"] == "succeeded", (done, stack.logs())
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id))
    assert made, "the environment scored no rollout in a sandbox"
    assert {sandbox.attempt.number for sandbox in made} == {1}
    assert {sandbox.status for sandbox in made} == {SandboxStatus.STOPPED}
    assert all(sandbox.labels == {"lab.job": job_id, "lab.attempt": "1"} for sandbox in made)
    assert all(sandbox.project_id == owner.project.pk for sandbox in made)
    assert not {sandbox.public_id for sandbox in made} & _held(runtime)
    listed = api.client.get("/sandboxes", params={"label[lab.job]": job_id}).json()["data"]
    assert sorted(item["id"] for item in listed) == sorted(sandbox.public_id for sandbox in made)
    assert {item["job_id"] for item in listed} == {job_id}
    created = AuditLogEntry.objects.filter(action="sandbox.create", target__in=[sandbox.public_id for sandbox in made])
    assert {entry.data["job"] for entry in created} == {job_id}
    values = MetricStep.objects.get(job__public_id=job_id, step=2).values
    assert 0.0 <= values["reward/python-code/passed/mean"] <= 1.0
    # The job's metrics count its sandboxes as Lab saw them when each step arrived.
    points = api.client.get(f"/jobs/{job_id}/metrics", params={"names": "sandboxes/made,sandboxes/active,sandboxes/seconds"})
    counted = [point["values"] for point in points.json()["data"] if point["values"]]
    assert counted, "no step of the job counts its sandboxes"
    assert 1 <= counted[-1]["sandboxes/made"] <= len(made) and 0 <= counted[-1]["sandboxes/active"] <= 1
    assert counted[-1]["sandboxes/seconds"] > 0


def test_an_evaluation_of_the_code_environment_scores_its_samples_in_sandboxes_of_its_attempt(owner, stack, runtime):
    lab = Lab(api_key=owner.key, base_url=stack.base_url)
    created = lab.evals.create(
        model="lab/tiny-random-llama",
        environments=[{"id": "lab/python-code", "args": {"num_tests": 2, "timeout_s": 5.0}, "num_examples": 2, "rollouts_per_example": 2}],
        sampling={"max_tokens": 16, "seed": 1},
    )
    done = lab.evals.wait(created.id, timeout=300, progress=False)
    assert done.status == "succeeded", stack.logs()
    evaluation = Evaluation.objects.unscoped().select_related("job").get(public_id=created.id)
    job = evaluation.job
    assert job.kind == JobKind.EVALUATION
    samples = list(EvaluationSample.objects.unscoped().filter(job=job))
    assert len(samples) == 4
    # Scored by running the program: a sample no sandbox could score is an error, without the functions.
    assert all(set(sample.functions) == {"passed", "all_passed"} and not sample.error for sample in samples)
    assert set(done.results["lab/python-code"]["functions"]) == {"passed", "all_passed"}
    made = list(Sandbox.objects.unscoped().filter(attempt__job=job))
    assert made, "the evaluation scored no sample in a sandbox"
    assert {sandbox.attempt.number for sandbox in made} == {1}
    assert {sandbox.status for sandbox in made} == {SandboxStatus.STOPPED}
    assert all(sandbox.labels == {"lab.job": job.public_id, "lab.attempt": "1"} for sandbox in made)
    assert not {sandbox.public_id for sandbox in made} & _held(runtime)
    billed = UsageInterval.objects.unscoped().filter(sandbox_public_id__in=[sandbox.public_id for sandbox in made])
    assert {(row.meter, row.job_public_id, row.project_id) for row in billed} == {
        (Meter.SANDBOX_CPU, job.public_id, owner.project.pk), (Meter.SANDBOX_MEMORY, job.public_id, owner.project.pk),
    }


def test_web_and_the_worker_restarted_mid_run_lose_no_step_and_leave_no_sandbox(owner, spec, stack, runtime):
    steps = 20  # enough that it is still training when both go, however fast it runs
    api = Api(stack, owner.key)
    job_id = api.create(_code_spec(spec, max_steps=steps))["id"]
    wait_for(
        lambda: Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id).exists(),
        timeout=240, what="a first sandbox of the attempt",
    )
    stack.kill("web")
    stack.kill("worker")
    assert MetricStep.objects.filter(job__public_id=job_id).count() < steps  # killed mid-run
    stack.start_web()
    stack.start_worker()

    done = Api(stack, owner.key).wait_status(job_id, TERMINAL, timeout=300)

    assert done["status"] == "succeeded", done
    assert list(MetricStep.objects.filter(job__public_id=job_id).order_by("step").values_list("step", flat=True)) == list(range(1, steps + 1))
    assert JobAttempt.objects.filter(job__public_id=job_id).count() == 1
    made = list(Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id))
    assert {sandbox.status for sandbox in made} == {SandboxStatus.STOPPED}
    wait_for(lambda: not {sandbox.public_id for sandbox in made} & _held(runtime), timeout=30, what="the agent holding none of them")


def test_an_engine_killed_with_sigkill_leaves_no_sandbox_once_its_attempt_is_closed(owner, spec, stack, runtime):
    api = Api(stack, owner.key)
    job_id = api.create(_code_spec(spec, max_steps=500, max_restarts=0))["id"]
    running = wait_for(
        lambda: Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id, status=SandboxStatus.RUNNING).first(),
        timeout=240, what="a running sandbox of the attempt",
    )
    assert running.public_id in _held(runtime)
    os.kill(engine_pid(stack, job_id, 1), signal.SIGKILL)
    done = api.wait_status(job_id, TERMINAL, timeout=120)
    assert done["status"] == "failed", done
    assert JobAttempt.objects.get(job__public_id=job_id, number=1).state == AttemptState.ENDED
    wait_for(
        lambda: not Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id, status__in=ACTIVE_STATUSES).exists(),
        timeout=30, what="the attempt's sandboxes stopped",
    )
    made = {sandbox.public_id for sandbox in Sandbox.objects.unscoped().filter(attempt__job__public_id=job_id)}
    # The row is stopped first, then the agent told to destroy it: the agent lets it go just after.
    wait_for(lambda: not made & _held(runtime), timeout=30, what="the agent holding none of the attempt's sandboxes")
    deleted = AuditLogEntry.objects.filter(action="sandbox.delete", target=running.public_id)
    assert deleted.exists() and all(entry.actor_user is None for entry in deleted)  # Lab's, not the engine's
