"""Evaluations for tests: a small body, and an engine that reports an evaluation's samples
through the ingest API as ``python -m engine evaluate`` would."""

from __future__ import annotations

import copy

from evaluations.models import Evaluation
from evaluations.services import evaluation_create
from jobs.ingest.schemas import EvaluationSamplesBatch
from jobs.ingest.services import ingest_evaluation_samples
from jobs.models import Job
from jobs.services import job_claim_for_start, job_transition
from lab.audit import Actor
from tests.support.jobs_helpers import Engine

#: Two environments on the tiny model: 3 examples x 2 rollouts of addition, 2 x 1 of reverse-text.
EVALUATION_BODY = {
    "name": "tiny-baseline",
    "model": {"type": "model", "id": "lab/tiny-random-llama"},
    "environments": [
        {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2},
        {"id": "lab/reverse-text", "num_examples": 2},
    ],
    "sampling": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 8, "seed": 3},
}


def evaluation_body(**changes) -> dict:
    """A fresh copy of ``EVALUATION_BODY`` with ``changes``."""
    return {**copy.deepcopy(EVALUATION_BODY), **changes}


def create_evaluation(tenant, body: dict | None = None) -> Evaluation:
    """Create an evaluation as the tenant's owner (through the service)."""
    return evaluation_create(project=tenant.project, actor=Actor(user=tenant.user), data=body or evaluation_body())


def sample(environment: int, example: int, rollout: int, *, num_examples: int, reward: float = 0.0, **fields) -> dict:
    """One evaluation sample as the engine reports it."""
    return {
        "environment": environment,
        "example": example,
        "rollout": rollout,
        "num_examples": num_examples,
        "prompt": [{"role": "user", "content": f"example {example}"}],
        "completion": f"reply {rollout}",
        "answer": "42",
        "reward": reward,
        "functions": {"correct": reward},
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "latency_s": 0.25,
        **fields,
    }


def every_sample(evaluation: Evaluation, reward=lambda environment, example, rollout: 0.0) -> list[dict]:
    """Every sample the evaluation plans (its counts must be given, not "all"), rewards from ``reward``."""
    samples = []
    for index, environment in enumerate(evaluation.environments):
        count = environment["num_examples"]
        for example in range(count):
            for rollout in range(environment["rollouts_per_example"]):
                samples.append(sample(index, example, rollout, num_examples=count, reward=reward(index, example, rollout)))
    return samples


def end_evaluation(evaluation_id: str, status: str, rows: list[dict] | None = None) -> None:
    """Store ``rows`` (default every planned sample, rewards 1 for even examples) through the
    ingest service, as the evaluation's first attempt, then end its job in ``status``. (Not over
    Django's test client: it would put back the connection closing that ``wsgi_transport`` takes
    away.)"""
    evaluation = Evaluation.objects.unscoped().select_related("job").get(public_id=evaluation_id)
    attempt = job_claim_for_start(job_id=evaluation.job_id)
    rows = rows if rows is not None else every_sample(evaluation, reward=lambda environment, example, rollout: float(example % 2 == 0))
    if rows:
        ingest_evaluation_samples(attempt=attempt, batch=EvaluationSamplesBatch(attempt=attempt.number, samples=rows))
    job_transition(job=Job.objects.unscoped().get(pk=evaluation.job_id), to=status, error_message="it broke")


class EvaluationEngine(Engine):
    """Claims the evaluation job's next attempt and reports for it to the ingest API."""

    def __init__(self, job: Job):
        super().__init__(job)
        self.attempt = Job.objects.unscoped().get(pk=job.pk).attempt

    def running(self, step: int = 0) -> None:
        self.post("status", {"attempt": self.attempt, "phase": "running", "step": step})

    def evaluation_samples(self, rows: list[dict]) -> dict:
        """Post ``rows`` (``sample`` dicts); return Lab's ``{"accepted", "duplicates"}``."""
        return self.post("evaluation-samples", {"attempt": self.attempt, "samples": rows})
