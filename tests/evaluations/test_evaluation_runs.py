"""An evaluation job's run as Lab sees it, on a fake launcher: its samples through the ingest API
(each stored once, only those the evaluation plans), its end (never succeeded with a sample
missing), its results and its webhooks (docs/evaluations.md)."""

from __future__ import annotations

import json

import pytest

from evaluations.models import Evaluation
from evaluations.services import evaluation_retry, evaluation_settle
from jobs.evaluation_samples import EvaluationSample
from jobs.launchers import registry
from jobs.models import Job, JobAttempt, JobStatus
from jobs.pipeline import launch, reconciler
from jobs.services import job_transition
from jobs.webhooks.models import WebhookEndpoint, WebhookMessage
from lab.audit import Actor
from tests.support.evaluations import EvaluationEngine, create_evaluation, evaluation_body, every_sample, sample
from tests.support.fake_launcher import FakeLauncher
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

S = JobStatus


@pytest.fixture
def launcher(monkeypatch) -> FakeLauncher:
    fake = FakeLauncher()
    monkeypatch.setattr(registry, "get_launcher", lambda: fake)
    return fake


def launched(evaluation: Evaluation) -> tuple[EvaluationEngine, JobAttempt]:
    """The evaluation's first attempt, launched on the fake launcher and reporting."""
    engine = EvaluationEngine(evaluation.job)
    attempt = JobAttempt.objects.get(job=evaluation.job, number=1)
    launch.attempt_launch(attempt_id=attempt.pk)
    engine.running()
    return engine, JobAttempt.objects.get(pk=attempt.pk)


def job_of(evaluation: Evaluation) -> Job:
    return Job.objects.unscoped().get(pk=evaluation.job_id)


def test_a_sample_is_stored_once_however_often_it_arrives(owner):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    rows = every_sample(evaluation)
    assert engine.evaluation_samples(rows[:5]) == {"accepted": 5, "duplicates": 0}
    assert engine.evaluation_samples(rows[3:] + rows[3:4]) == {"accepted": 3, "duplicates": 3}
    assert engine.evaluation_samples(rows) == {"accepted": 0, "duplicates": 8}
    stored = EvaluationSample.objects.filter(job=evaluation.job).order_by("id")
    assert [(s.environment, s.example, s.rollout) for s in stored] == [
        (row["environment"], row["example"], row["rollout"]) for row in rows
    ]
    assert job_of(evaluation).status == S.RUNNING  # samples prove it runs


@pytest.mark.parametrize(
    "bad",
    [
        sample(2, 0, 0, num_examples=3),  # no third environment
        sample(0, 3, 0, num_examples=3),  # example beyond num_examples
        sample(0, 0, 2, num_examples=3),  # rollout beyond rollouts_per_example
        sample(0, 0, 0, num_examples=4),  # another count than the evaluation's
    ],
)
def test_a_sample_outside_the_plan_is_refused_and_its_batch_not_stored(owner, bad):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    answer = engine.client.post(f"{engine.base}/evaluation-samples", {"attempt": 1, "samples": [sample(0, 0, 0, num_examples=3), bad]}, format="json")
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "samples.1"
    assert not EvaluationSample.objects.filter(job=evaluation.job).exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("reward", "0.5"), ("reward", float("nan")), ("rollout", True), ("prompt", "hi"), ("colour", "red"),
        ("prompt", [{"role": "user", "content": "a\x00b"}]), ("info", {"blob": "x" * 300_000}),
    ],
)
def test_a_malformed_sample_is_a_400(owner, field, value):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    body = json.dumps({"attempt": 1, "samples": [{**sample(0, 0, 0, num_examples=3), field: value}]}, allow_nan=True)
    answer = engine.client.post(f"{engine.base}/evaluation-samples", body, content_type="application/json")
    assert answer.status_code == 400, answer.content
    assert not EvaluationSample.objects.filter(job=evaluation.job).exists()


def test_a_training_job_and_an_ended_evaluation_take_no_evaluation_samples(owner, spec):
    training = Engine(submit(owner, spec))
    answer = training.client.post(f"{training.base}/evaluation-samples", {"attempt": 1, "samples": [sample(0, 0, 0, num_examples=1)]}, format="json")
    assert answer.status_code == 400
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    job_transition(job=job_of(evaluation), to=S.FAILED, error_message="stopped")
    late = engine.client.post(f"{engine.base}/evaluation-samples", {"attempt": 1, "samples": every_sample(evaluation)}, format="json")
    assert late.status_code == 409
    assert not EvaluationSample.objects.unscoped().exists()


def test_an_exit_0_with_samples_missing_is_a_crash_and_the_next_attempt_completes_it(owner, launcher):
    evaluation = create_evaluation(owner)
    engine, attempt = launched(evaluation)
    rows = every_sample(evaluation)
    engine.evaluation_samples(rows[:-2])
    launcher.exit(attempt.handle, 0)
    reconciler.reconcile_job(job_id=evaluation.job_id)
    job = job_of(evaluation)
    assert (job.status, job.status_reason, job.crash_count) == (S.QUEUED, "requeued_after_crash", 1)
    event = job.events.get(type="job.requeued")
    assert event.data["crashes"] == 1
    assert evaluation_settle(job_id=job.pk).results is None  # not ended: nothing counted

    second = EvaluationEngine(job)  # the reconciler's admission would claim it so
    launch.attempt_launch(attempt_id=JobAttempt.objects.get(job=job, number=2).pk)
    second.running()
    assert second.evaluation_samples(rows) == {"accepted": 2, "duplicates": 6}
    launcher.exit(JobAttempt.objects.get(job=job, number=2).handle, 0)
    reconciler.reconcile_job(job_id=job.pk)
    assert job_of(evaluation).status == S.SUCCEEDED
    assert sorted(EvaluationSample.objects.filter(job=job).values_list("attempt", flat=True)) == [1] * 6 + [2] * 2


def test_an_evaluation_missing_samples_past_max_restarts_fails(owner, launcher):
    evaluation = create_evaluation(owner)
    engine, attempt = launched(evaluation)
    Job.objects.unscoped().filter(pk=evaluation.job_id).update(crash_count=2)  # max_restarts of an evaluation: 2
    launcher.exit(attempt.handle, 0)
    reconciler.reconcile_job(job_id=evaluation.job_id)
    job = job_of(evaluation)
    assert (job.status, job.error_code) == (S.FAILED, "max_restarts_exceeded")
    assert "environment 0: 0 of 6 samples" in job.error_message
    assert "environment 1: 0 of 2 samples" in job.error_message


def test_a_finished_evaluation_has_its_results_and_its_webhook_once(owner, launcher, settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    answer = owner.client().post(
        "/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "events": ["evaluation.completed", "evaluation.failed"]},
        format="json",
    )
    assert answer.status_code == 201, answer.content
    evaluation = create_evaluation(owner)
    engine, attempt = launched(evaluation)
    # addition: example e's rollouts succeed for e < rollout + 1; reverse-text: none, one timed out, one error.
    rows = every_sample(evaluation, reward=lambda environment, example, rollout: 1.0 if environment == 0 and example <= rollout else 0.0)
    rows[-2]["timed_out"] = True
    rows[-1].update(error="the rubric raised", functions={})
    engine.evaluation_samples(rows)
    launcher.exit(attempt.handle, 0)
    reconciler.reconcile_job(job_id=evaluation.job_id)
    assert job_of(evaluation).status == S.SUCCEEDED
    settled = evaluation_settle(job_id=evaluation.job_id)
    assert settled.results == {
        "lab/addition": {
            "samples": 6, "examples": 3, "reward_mean": 0.5,
            # example means 1.0, 0.5, 0.0: sample standard deviation 0.5, over sqrt(3)
            "reward_stderr": pytest.approx(0.5 / 3 ** 0.5),
            "functions": {"correct": 0.5},
            # pass@1: 1, 1/2, 0; pass@2: 1, 1, 0 (example 2 never succeeds)
            "pass_at_k": {"1": 0.5, "2": pytest.approx(2 / 3)},
            "errors": 0, "timeouts": 0, "truncated": 0, "tokens": {"prompt": 30, "completion": 18},
        },
        "lab/reverse-text": {
            "samples": 2, "examples": 2, "reward_mean": 0.0, "reward_stderr": 0.0, "functions": {"correct": 0.0},
            "pass_at_k": {"1": 0.0}, "errors": 1, "timeouts": 1, "truncated": 0, "tokens": {"prompt": 10, "completion": 6},
        },
    }
    assert evaluation_settle(job_id=evaluation.job_id).results == settled.results
    messages = list(WebhookMessage.objects.filter(type__startswith="evaluation."))
    assert [message.type for message in messages] == ["evaluation.completed"]
    body = json.loads(messages[0].body)
    assert body["data"]["id"] == evaluation.public_id
    assert body["data"]["status"] == "succeeded"
    assert body["data"]["results"] == json.loads(json.dumps(settled.results))
    assert body["data"]["progress"] == {"samples": 8, "expected_samples": 8}
    got = owner.client().get(f"/api/v1/evaluations/{evaluation.public_id}").json()
    assert got["results"] == body["data"]["results"]
    assert got["usage"]["prompt_tokens"] == 40 and got["usage"]["completion_tokens"] == 24
    assert WebhookEndpoint.objects.filter(project=owner.project).count() == 1


def test_a_failed_evaluation_is_settled_on_read_and_again_after_a_retry(owner, settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    owner.client().post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "events": ["evaluation.failed"]}, format="json")
    evaluation = create_evaluation(owner, evaluation_body(environments=[{"id": "lab/addition", "num_examples": 2}]))
    engine = EvaluationEngine(evaluation.job)
    engine.evaluation_samples([sample(0, 0, 0, num_examples=2, reward=1.0)])
    job_transition(job=job_of(evaluation), to=S.FAILED, error_code="environment_error", error_message="boom")
    url = f"/api/v1/evaluations/{evaluation.public_id}"
    got = owner.client().get(url).json()  # the settle task has not run: the read settles it
    assert (got["status"], got["error"]) == ("failed", {"code": "environment_error", "message": "boom"})
    assert got["results"]["lab/addition"]["samples"] == 1
    assert got["results"]["lab/addition"]["reward_stderr"] is None
    evaluation_retry(evaluation=evaluation, actor=Actor(user=owner.user))
    assert owner.client().get(url).json()["results"] is None  # running again: the old results no longer hold
    job_transition(job=job_of(evaluation), to=S.CANCELLED)
    assert owner.client().get(url).json()["results"]["lab/addition"]["samples"] == 1
    assert list(WebhookMessage.objects.values_list("type", flat=True)) == ["evaluation.failed"]  # a cancel sends none
