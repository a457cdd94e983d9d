"""JSON shapes of evaluations and their samples (docs/evaluations.md, docs/api.md "Evaluation")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evaluations.models import Evaluation, Source
from evaluations.specs import ALL_EXAMPLES
from jobs.evaluation_samples import EvaluationSample
from jobs.models import JobStatus
from lab.formats import iso, money


@dataclass(frozen=True)
class Progress:
    """What an evaluation's job has stored so far: samples, and their prompt and completion tokens."""

    samples: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def expected_samples(evaluation: Evaluation) -> int | None:
    """The samples an evaluation plans (examples × rollouts per environment), or None while an
    environment takes its whole eval split (only its engine counts that)."""
    total = 0
    for environment in evaluation.environments:
        if environment["num_examples"] == ALL_EXAMPLES:
            return None
        total += environment["num_examples"] * environment["rollouts_per_example"]
    return total


def evaluation_to_dict(evaluation: Evaluation, progress: Progress) -> dict[str, Any]:
    """Return the Evaluation object: its job's status (a pushed evaluation is ``running`` until
    finalized), error, timestamps and usage (with the tokens its samples used), what it scores,
    where its samples come from, and its results once its job has ended."""
    job = evaluation.job
    receiving = evaluation.source == Source.PUSHED and evaluation.finalized_at is None
    return {
        "id": evaluation.public_id,
        "object": "evaluation",
        "name": evaluation.name,
        "source": evaluation.source,
        "status": JobStatus.RUNNING if receiving else job.status,
        "status_reason": job.status_reason or None,
        "job_id": job.public_id,
        "model": {"type": evaluation.target_type, "id": evaluation.target_id},
        "base_model": evaluation.base_model,
        "environments": evaluation.environments,
        "sampling": evaluation.sampling,
        "progress": {"samples": progress.samples, "expected_samples": expected_samples(evaluation)},
        "results": evaluation.results if evaluation.results_for is not None and evaluation.results_for == job.finished_at else None,
        "error": {"code": job.error_code, "message": job.error_message} if job.error_code else None,
        "usage": {
            "gpu_seconds": round(job.gpu_seconds, 3),
            "cpu_seconds": round(job.cpu_seconds, 3),
            "cost_usd": money(job.cost_usd),
            "prompt_tokens": progress.prompt_tokens,
            "completion_tokens": progress.completion_tokens,
        },
        "metadata": evaluation.metadata,
        "details": evaluation.details,
        "created_at": iso(evaluation.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
    }


def sample_to_dict(sample: EvaluationSample, environment_ids: list[str]) -> dict[str, Any]:
    """Return one EvaluationSample object; ``environment_ids`` are the evaluation's, in order."""
    return {
        "id": sample.public_id,
        "object": "evaluation_sample",
        "environment": environment_ids[sample.environment] if sample.environment < len(environment_ids) else None,
        "example": sample.example,
        "rollout": sample.rollout,
        "prompt": sample.prompt,
        "completion": sample.completion,
        "answer": sample.answer,
        "reward": sample.reward,
        "functions": sample.functions,
        "info": sample.info,
        "tokens": {"prompt": sample.prompt_tokens, "completion": sample.completion_tokens},
        "latency_s": sample.latency_s,
        "truncated": sample.truncated,
        "timed_out": sample.timed_out,
        "error": sample.error or None,
        "attempt": sample.attempt,
        "created_at": iso(sample.created_at),
    }
