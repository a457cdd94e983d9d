"""Per-step distributions of rollout rewards and advantages: a histogram of the stored rollout
samples of one step, as researchers read them next to the mean curves (Prime Intellect's
dashboard calls these "distributions").

The histogram is over the samples Lab stores for the step (the engine reports a subset of each
step's rollouts, ``samples_per_step`` of them), so ``count`` says how many it is built from.
Bins are equal-width over [min, max], each closed on the left and open on the right except the
last, which is closed (numpy.histogram's convention).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobs.models import Job, RolloutSample
from lab.errors import FieldError, LabError
from lab.paging import int_param

#: What a distribution can be of: a rollout sample's field.
DISTRIBUTION_TYPES = ("reward", "advantage")
DEFAULT_BINS, MAX_BINS = 10, 100


def histogram(values: Sequence[float], bins: int) -> list[dict[str, float | int]]:
    """Return ``bins`` equal-width bins ``{"low", "high", "count"}`` over [min, max] of ``values``
    (one bin when every value is the same; none for no values)."""
    if not values:
        return []
    low, high = min(values), max(values)
    if low == high:
        return [{"low": low, "high": high, "count": len(values)}]
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(int((value - low) / width), bins - 1)] += 1
    return [
        {"low": low + index * width, "high": high if index == bins - 1 else low + (index + 1) * width, "count": count}
        for index, count in enumerate(counts)
    ]


def job_distribution(*, job: Job, params: Mapping[str, str]) -> dict[str, Any]:
    """Return the body of ``GET /jobs/{id}/distributions?step=&type=&bins=``:
    ``{"object": "distribution", "job_id", "step", "type", "count", "min", "max", "mean", "bins"}``.

    ``type`` is ``reward`` (default) or ``advantage``; ``step`` defaults to the latest step with
    samples (``null`` with no bins before the first); ``bins`` is 1 to 100 (default 10). Raises
    LabError ``invalid_request`` naming the parameter for any other value.
    """
    kind = params.get("type") or "reward"
    if kind not in DISTRIBUTION_TYPES:
        message = f"type must be one of {', '.join(DISTRIBUTION_TYPES)}."
        raise LabError("invalid_request", message, param="type", errors=[FieldError("type", "invalid_value", message)])
    step = int_param(params, "step", minimum=0, maximum=10**9, default=None)
    bins = int_param(params, "bins", minimum=1, maximum=MAX_BINS, default=DEFAULT_BINS)
    samples = RolloutSample.objects.filter(job=job)
    if step is None:
        step = samples.order_by("-step").values_list("step", flat=True).first()
    values = list(samples.filter(step=step).values_list(kind, flat=True)) if step is not None else []
    return {
        "object": "distribution",
        "job_id": job.public_id,
        "step": step,
        "type": kind,
        "count": len(values),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "mean": sum(values) / len(values) if values else None,
        "bins": histogram(values, bins),
    }
