"""An evaluation's results, counted from its stored samples (docs/evaluations.md "Results").

Per environment (keyed by its id): ``samples`` stored and ``examples`` they cover; ``reward_mean``
over every sample (an error or a timeout counts its reward 0); ``reward_stderr``, the standard
error of that mean over examples (each example's mean reward over its rollouts; their sample
standard deviation over the square root of their number; null for fewer than 2 examples), since
an example's rollouts are not independent draws; ``functions``, each reward function's mean over
the samples that scored it; ``pass_at_k`` for k = 1, 2, 4, ... up to and including the rollouts per
example (``pass_at_k``); ``errors``, ``timeouts`` and ``truncated`` counts; ``tokens`` used
(``{"prompt", "completion"}``).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from django.db.models import Avg, Count, Q, Sum

from jobs.evaluation_samples import EvaluationSample
from jobs.models import Job

#: The reward at or above which a rollout counts as a success for pass@k: the full reward of a
#: rubric whose weights add up to 1 (a weighted sum may exceed 1; partial credit below it fails).
SUCCESS_REWARD = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Return the unbiased estimate of pass@k from ``n`` rollouts of one example of which ``c``
    succeeded: 1 − C(n−c, k) / C(n, k), the probability that at least one of k rollouts drawn
    without replacement succeeds (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code", eq. 1). Raises ValueError unless 0 ≤ c ≤ n and 1 ≤ k ≤ n."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, not n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(rollouts: int) -> list[int]:
    """The k of pass@k reported for ``rollouts`` rollouts per example: 1, 2, 4, ... and ``rollouts``."""
    values, k = [], 1
    while k < rollouts:
        values.append(k)
        k *= 2
    return [*values, rollouts]


def evaluation_results(*, job: Job, environments: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return the results of ``job``'s samples, keyed by the id of each of ``environments`` (the
    evaluation's, in ``[[eval.env]]`` order); an environment with no sample has zeros and nulls."""
    samples = EvaluationSample.objects.filter(job=job)
    totals = {
        row["environment"]: row
        for row in samples.values("environment").annotate(
            samples=Count("id"), reward_mean=Avg("reward"), errors=Count("id", filter=~Q(error="")),
            timeouts=Count("id", filter=Q(timed_out=True)), truncated=Count("id", filter=Q(truncated=True)),
            prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens"),
        ).order_by()
    }
    examples: dict[int, list[dict]] = defaultdict(list)
    for row in samples.values("environment", "example").annotate(
        rollouts=Count("id"), mean=Avg("reward"), successes=Count("id", filter=Q(reward__gte=SUCCESS_REWARD)),
    ).order_by():
        examples[row["environment"]].append(row)
    function_sums: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for environment, functions in samples.values_list("environment", "functions").iterator(chunk_size=5000):
        for name, value in (functions or {}).items():
            total = function_sums[environment][name]
            total[0] += value
            total[1] += 1
    results = {}
    for index, environment in enumerate(environments):
        row = totals.get(index, {})
        rows = examples.get(index, [])
        means = [example["mean"] for example in rows]
        rollouts = int(environment.get("rollouts_per_example") or 1)
        results[environment["id"]] = {
            "samples": row.get("samples", 0),
            "examples": len(rows),
            "reward_mean": row.get("reward_mean"),
            "reward_stderr": statistics.stdev(means) / math.sqrt(len(means)) if len(means) >= 2 else None,
            "functions": {name: total / count for name, (total, count) in sorted(function_sums[index].items())},
            "pass_at_k": _pass_at_k(rows, rollouts),
            "errors": row.get("errors", 0),
            "timeouts": row.get("timeouts", 0),
            "truncated": row.get("truncated", 0),
            "tokens": {"prompt": row.get("prompt_tokens") or 0, "completion": row.get("completion_tokens") or 0},
        }
    return results


def _pass_at_k(rows: list[dict], rollouts: int) -> dict[str, float]:
    """pass@k for each of ``k_values(rollouts)``, averaged over the examples that have at least
    k rollouts stored (all of them, once the run is complete)."""
    estimates = {}
    for k in k_values(rollouts):
        counted = [pass_at_k(row["rollouts"], row["successes"], k) for row in rows if row["rollouts"] >= k]
        if counted:
            estimates[str(k)] = sum(counted) / len(counted)
    return estimates
