"""Evaluations run for real: web, a Celery worker with beat, the local launcher and the engine's
evaluation run on the tiny model, against PostgreSQL and Redis (docs/evaluations.md)."""

from __future__ import annotations

import os
import signal

import pytest
from labsdk import Lab

from evaluations.models import Evaluation
from jobs.evaluation_samples import EvaluationSample
from jobs.models import JobAttempt, JobEvent, JobKind
from tests.support.live import alive, engine_pid
from tests.support.stack import STACK_TEST_MARKS, running_stack, wait_for

pytestmark = STACK_TEST_MARKS


@pytest.fixture
def stack(tmp_path, settings):
    with running_stack(tmp_path / "lab", settings, LAB_STOP_GRACE_S="2", LAB_KILL_GRACE_S="5") as lab:
        yield lab


def keys(evaluation: Evaluation) -> list[tuple[int, int, int]]:
    return list(EvaluationSample.objects.unscoped().filter(job=evaluation.job_id).values_list("environment", "example", "rollout"))


def test_an_evaluation_of_the_tiny_model_ends_with_every_sample_stored_once_and_its_results(owner, stack):
    lab = Lab(api_key=owner.key, base_url=stack.base_url)
    created = lab.evals.create(
        model="lab/tiny-random-llama",
        environments=[
            {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2},
            {"id": "lab/reverse-text", "num_examples": 2},
        ],
        sampling={"max_tokens": 4, "temperature": 0.7, "seed": 1},
    )
    done = lab.evals.wait(created.id, timeout=240, progress=False)
    assert done.status == "succeeded", stack.logs()
    evaluation = Evaluation.objects.unscoped().select_related("job").get(public_id=created.id)
    assert evaluation.job.kind == JobKind.EVALUATION
    assert sorted(keys(evaluation)) == [(0, e, r) for e in range(3) for r in range(2)] + [(1, 0, 0), (1, 1, 0)]
    assert set(done.results) == {"lab/addition", "lab/reverse-text"}
    assert (done.results["lab/addition"]["samples"], done.results["lab/reverse-text"]["samples"]) == (6, 2)
    assert set(done.results["lab/addition"]["functions"]) == {"correct", "answer_only"}
    assert set(done.results["lab/addition"]["pass_at_k"]) == {"1", "2"}
    assert done.usage["cpu_seconds"] > 0 and done.usage["completion_tokens"] > 0
    assert done.progress == {"samples": 8, "expected_samples": 8}
    types = list(JobEvent.objects.filter(job=evaluation.job_id).order_by("id").values_list("type", flat=True))
    assert types[:3] == ["job.queued", "job.starting", "job.started"] and types[-1] == "job.succeeded"
    assert "checkpoint.ready" not in types  # it never trained
    samples = lab.evals.samples(created.id)
    assert len(samples) == 8 and all(sample.prompt and sample.tokens["completion"] >= 1 for sample in samples)


def test_a_worker_and_an_engine_killed_mid_run_neither_duplicate_nor_lose_a_sample(owner, stack):
    lab = Lab(api_key=owner.key, base_url=stack.base_url)
    # Enough samples that the engine is still sampling when the first ones are stored: it samples
    # 64 examples (256 samples) per call, a few seconds each, and they are stored as they come.
    created = lab.evals.create(
        model="lab/tiny-random-llama",
        environments=[{"id": "lab/addition", "num_examples": 400, "rollouts_per_example": 4}],
        sampling={"max_tokens": 24, "seed": 2},
    )
    evaluation = Evaluation.objects.unscoped().get(public_id=created.id)
    job_id = evaluation.job.public_id
    wait_for(lambda: EvaluationSample.objects.unscoped().filter(job=evaluation.job_id).exists(), timeout=180, what="a first sample")
    stack.kill("worker")
    pid = engine_pid(stack, job_id, 1)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), timeout=30, what="the engine to die")
    stored_at_kill = len(keys(evaluation))
    assert 0 < stored_at_kill < 1600, "the engine was killed after it had finished: give it more to sample"
    stack.start_worker()
    done = lab.evals.wait(created.id, timeout=420, progress=False)
    assert done.status == "succeeded", stack.logs()
    stored = keys(evaluation)
    assert len(stored) == len(set(stored)) == 1600
    assert set(stored) == {(0, example, rollout) for example in range(400) for rollout in range(4)}
    by_attempt = {
        number: EvaluationSample.objects.unscoped().filter(job=evaluation.job_id, attempt=number).count()
        for number in (1, 2)
    }
    assert by_attempt[1] >= stored_at_kill and by_attempt[1] + by_attempt[2] == 1600 and by_attempt[2] > 0
    assert JobAttempt.objects.filter(job=evaluation.job_id).count() == 2
    assert done.results["lab/addition"]["samples"] == 1600
