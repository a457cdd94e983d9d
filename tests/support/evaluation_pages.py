"""Ended evaluations with samples for the dashboard's evaluation pages and the comparison, made
through the evaluations service and the ingest API as an engine would report them."""

from __future__ import annotations

from collections.abc import Callable

from evaluations.models import Evaluation
from evaluations.services import evaluation_settle
from jobs.models import Job, JobStatus
from jobs.services import job_transition
from tests.support.evaluations import EvaluationEngine, create_evaluation, every_sample

Reward = Callable[[int, int, int], float]


def ended_evaluation(
    tenant, body: dict | None = None, *, reward: Reward = lambda environment, example, rollout: 0.0,
    status: str = JobStatus.SUCCEEDED,
) -> Evaluation:
    """Create an evaluation as the tenant's owner, report every sample it plans with ``reward``
    (environment, example, rollout) as its engine would, end its job with ``status`` and count
    its results."""
    evaluation = create_evaluation(tenant, body)
    engine = EvaluationEngine(evaluation.job)
    engine.running()
    engine.evaluation_samples(every_sample(evaluation, reward))
    job_transition(job=Job.objects.unscoped().get(pk=evaluation.job_id), to=status)
    return evaluation_settle(job_id=evaluation.job_id)
