"""Lab's evaluations and samples in the shapes Prime's evaluation clients read (``prime eval
get|list|samples|logs`` of ``prime==0.18.0``, ``prime_evals.models`` of ``prime-evals==0.2.4``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from evaluations.models import Evaluation, Source
from jobs.evaluation_samples import EvaluationSample
from jobs.models import ErrorCode, JobStatus

#: Lab's status as Prime's ``EvalStatus`` (``prime_cli.utils.hosted_eval``); a job stopped for
#: running past its time limit is Prime's ``TIMEOUT``.
EVAL_STATUSES = {
    JobStatus.QUEUED: "PENDING",
    JobStatus.STARTING: "RUNNING",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.CANCELLING: "RUNNING",
    JobStatus.SUCCEEDED: "COMPLETED",
    JobStatus.FAILED: "FAILED",
    JobStatus.CANCELLED: "CANCELLED",
}


def viewer_url(evaluation: Evaluation) -> str:
    """The evaluation's page in Lab's dashboard, which Prime's CLI prints as "View results"."""
    project = evaluation.project
    return f"{settings.LAB_PUBLIC_URL}/o/{project.organization.slug}/p/{project.slug}/evaluations/{evaluation.public_id}/"


def evaluation_to_prime(evaluation: Evaluation, lab: dict[str, Any]) -> dict[str, Any]:
    """Return Prime's evaluation object for ``evaluation``, from ``lab``, its Evaluation object
    (``evaluations.serializers.evaluation_to_dict``): ``metrics`` are Lab's results of its first
    environment as Prime's averages (``avg_reward``, ``avg_<function>``, ``pass_at_k``)."""
    job = evaluation.job
    status = EVAL_STATUSES[lab["status"]]
    if status == "FAILED" and job.error_code == ErrorCode.MAX_RUNTIME_EXCEEDED:
        status = "TIMEOUT"
    environments = [environment["id"] for environment in evaluation.environments]
    results = next(iter((lab["results"] or {}).values()), None)
    metrics = {}
    if results is not None:
        metrics = {
            "avg_reward": results["reward_mean"], "reward_stderr": results["reward_stderr"],
            **{f"avg_{name}": value for name, value in results["functions"].items()},
            "pass_at_k": results["pass_at_k"], "errors": results["errors"], "timeouts": results["timeouts"],
        }
    first = evaluation.environments[0] if evaluation.environments else {}
    return {
        "evaluation_id": evaluation.public_id,
        "id": evaluation.public_id,
        "name": evaluation.name,
        "status": status,
        "model_name": evaluation.target_id,
        "environment_ids": environments,
        "environment_names": environments,
        "is_hosted": evaluation.source == Source.LAB,
        "eval_type": "hosted" if evaluation.source == Source.LAB else "pushed",
        "framework": "verifiers",
        "tags": [],
        "metadata": {
            "num_examples": first.get("num_examples"), "rollouts_per_example": first.get("rollouts_per_example"),
            "sampling_args": {key: value for key, value in evaluation.sampling.items() if value is not None},
            "job_id": job.public_id, **evaluation.metadata,
        },
        "metrics": metrics,
        "total_samples": lab["progress"]["samples"],
        "error_message": f"{job.error_code}: {job.error_message}" if job.error_code else None,
        "viewer_url": viewer_url(evaluation),
        "created_at": lab["created_at"],
        "updated_at": lab["finished_at"] or lab["started_at"] or lab["created_at"],
        "finalized_at": lab["finished_at"] if status in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED") else None,
    }


def sample_to_prime(sample: EvaluationSample, environment_ids: list[str]) -> dict[str, Any]:
    """Return one sample as Prime's (``prime_evals.models.Sample`` and its extra keys): the
    completion as chat messages, ``score`` and ``reward`` the reward, ``metrics`` each function's."""
    return {
        "id": sample.public_id,
        "example_id": sample.example,
        "rollout": sample.rollout,
        "task": environment_ids[sample.environment] if sample.environment < len(environment_ids) else None,
        "prompt": sample.prompt,
        "completion": [{"role": "assistant", "content": sample.completion}],
        "answer": sample.answer,
        "reward": sample.reward,
        "score": sample.reward,
        "metrics": sample.functions,
        "info": sample.info,
        "token_usage": {"input_tokens": sample.prompt_tokens, "output_tokens": sample.completion_tokens},
        "is_truncated": sample.truncated,
        "error": sample.error or None,
    }
