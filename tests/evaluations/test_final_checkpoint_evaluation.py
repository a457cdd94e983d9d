"""A training job whose ``[eval] evaluate_final_checkpoint`` is true gets an evaluation of its
final checkpoint when it succeeds, once, or an event saying why not (docs/evaluations.md)."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation
from evaluations.services import evaluation_of_final_checkpoint
from jobs import dispatch
from jobs.models import Job, JobEvent, JobStatus
from jobs.services import job_transition
from tests.support.jobs_helpers import Engine, ready_checkpoint, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]


@pytest.fixture
def asked(monkeypatch) -> list[int]:
    """The jobs whose final-checkpoint evaluation was sent (the task is not run here)."""
    sent: list[int] = []
    monkeypatch.setattr(dispatch, "enqueue_final_checkpoint_evaluation", sent.append)
    return sent


def trained(owner, spec, *, checkpoint_step: int | None = None, **eval_section):
    """A job of ``spec`` with ``eval_section`` in its ``[eval]``, its checkpoint of
    ``checkpoint_step`` ready (default its last step), then succeeded."""
    spec = {**spec, "sampling": {"max_tokens": 8, "temperature": 0.9, "extra_body": {"top_p": 0.8}}, "seed": 11}
    job = submit(owner, spec, eval={"interval": 0, **eval_section}, lora_rank=4, lora_alpha=8)
    checkpoint_id, _ = ready_checkpoint(Engine(job), step=checkpoint_step or job.max_steps)
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    return Job.objects.unscoped().get(pk=job.pk), checkpoint_id


def final_events(job: Job) -> list[tuple[str, str]]:
    return list(JobEvent.objects.filter(job=job, type="job.final_evaluation").values_list("level", "message"))


def test_a_succeeded_job_that_asks_gets_an_evaluation_of_its_final_checkpoint_once(owner, spec, asked):
    job, checkpoint_id = trained(
        owner, spec, evaluate_final_checkpoint=True, num_examples=-1, rollouts_per_example=4,
        sampling={"temperature": 0.5}, env=[{"id": "lab/addition", "args": {"max_operand": 5}}, {"id": "lab/reverse-text", "num_examples": 3}],
    )
    assert asked == [job.pk]
    evaluation = evaluation_of_final_checkpoint(job_id=job.pk)
    assert (evaluation.target_type, evaluation.target_id, evaluation.source_job_id) == ("checkpoint", checkpoint_id, job.pk)
    assert evaluation.environments == [
        {"id": "lab/addition", "args": {"max_operand": 5}, "num_examples": "all", "rollouts_per_example": 4},
        {"id": "lab/reverse-text", "args": {}, "num_examples": 3, "rollouts_per_example": 4},
    ]
    assert evaluation.sampling == {"temperature": 0.5, "top_p": 0.8, "max_tokens": 8, "seed": 11}
    assert (evaluation.name, evaluation.metadata) == (f"final checkpoint of {job.name}", {"job": job.public_id})
    assert evaluation.job.spec["init_from"] == checkpoint_id and evaluation.job.created_by == owner.user
    assert final_events(job) == [("info", f"Evaluating the final checkpoint {checkpoint_id}: {evaluation.public_id}.")]
    assert evaluation_of_final_checkpoint(job_id=job.pk) is None  # once
    assert Evaluation.objects.unscoped().count() == 1


def test_without_eval_blocks_it_evaluates_the_training_environments(owner, spec, asked):
    job, _ = trained(owner, spec, evaluate_final_checkpoint=True, num_examples=2)
    evaluation = evaluation_of_final_checkpoint(job_id=job.pk)
    assert evaluation.environments == [{"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 2, "rollouts_per_example": 1}]
    assert evaluation.sampling["temperature"] == 0.9


def test_without_a_ready_final_checkpoint_the_job_says_why(owner, spec, asked):
    job, _ = trained(owner, spec, checkpoint_step=2, evaluate_final_checkpoint=True)
    assert evaluation_of_final_checkpoint(job_id=job.pk) is None
    assert final_events(job) == [("warning", "The final checkpoint is not evaluated: no ready checkpoint of its last step (3) to evaluate")]
    assert not Evaluation.objects.unscoped().exists()
    assert evaluation_of_final_checkpoint(job_id=job.pk) is None and len(final_events(job)) == 1


def test_a_refused_evaluation_is_a_warning_on_the_job(owner, spec, asked):
    job, _ = trained(owner, spec, evaluate_final_checkpoint=True, env=[{"id": "lab/addition"}, {"id": "lab/addition", "name": "again"}])
    assert evaluation_of_final_checkpoint(job_id=job.pk) is None
    [(level, message)] = final_events(job)
    assert level == "warning" and "environments.1.id" in message and "listed twice" in message
    assert not Evaluation.objects.unscoped().exists() and Job.objects.unscoped().count() == 1


def test_a_job_that_does_not_ask_or_did_not_succeed_gets_none(owner, spec, asked):
    plain, _ = trained(owner, spec)
    failing = submit(owner, spec, eval={"evaluate_final_checkpoint": True})
    job_transition(job=failing, to=JobStatus.FAILED, error_message="no")
    assert asked == []
    assert evaluation_of_final_checkpoint(job_id=plain.pk) is None
    assert evaluation_of_final_checkpoint(job_id=failing.pk) is None
    assert not Evaluation.objects.unscoped().exists() and not JobEvent.objects.filter(type="job.final_evaluation").exists()
