"""Reads of the usage ledgers: compute (GPU- and CPU-seconds of job attempts and dedicated
inference servers, CPU- and memory GB-seconds of sandboxes) and served tokens (requests to
deployments), summed by day, resource, job and deployment over a time range."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Sum
from django.db.models.functions import TruncDate

from billing.models import TokenUsage, UsageInterval
from billing.pricing import micro_to_usd

#: What ``GET /usage`` may group by, and the row key each grouping adds.
GROUP_KEYS = {"day": "date", "resource": "resource", "job": "job_id", "deployment": "deployment_id"}
#: The ``resource`` of served tokens' rows (compute rows name a GPU type, ``cpu``, ``sandbox_cpu``
#: or ``sandbox_memory``).
TOKENS_RESOURCE = "tokens"
_COMPUTE_FIELDS = {"day": "day", "resource": "resource_type", "job": "job_public_id", "deployment": "deployment_public_id"}
_TOKEN_FIELDS = {"day": "day", "deployment": "deployment_public_id"}
#: The most rows one usage answer holds (a year of days × a few resources fits easily).
MAX_USAGE_ROWS = 10_000


def usage_rows(
    *,
    organization_id: int,
    project_id: int | None,
    start: datetime,
    end: datetime,
    group_by: tuple[str, ...],
    job_public_id: str | None = None,
    deployment_public_id: str | None = None,
) -> list[dict[str, Any]]:
    """Return usage summed per group: compute intervals that ended in [start, end) and served
    tokens of requests recorded in it.

    ``group_by`` holds keys of ``GROUP_KEYS``; each row has those keys (``date`` as
    ``YYYY-MM-DD`` UTC, ``resource`` the GPU type, ``cpu``, or ``tokens`` for served tokens,
    ``job_id`` (None on token rows and compute billed to no job), ``deployment_id`` (None on
    compute that is not a dedicated server's)) and ``gpu_seconds``, ``cpu_seconds``,
    ``memory_gb_seconds`` (floats), ``requests``, ``prompt_tokens``, ``completion_tokens`` (ints)
    and ``cost_usd`` (exact Decimal, both ledgers). ``project_id`` None means the whole
    organization; ``job_public_id`` keeps that job's compute only (its sandboxes' included),
    ``deployment_public_id`` that deployment's tokens and dedicated server's GPU-seconds only. Rows
    are ordered by their keys, None last.
    """
    totals: dict[tuple, dict[str, Any]] = {}

    def row(key: tuple) -> dict[str, Any]:
        if key not in totals:
            totals[key] = {"gpu": 0.0, "cpu": 0.0, "memory": 0.0, "requests": 0, "prompt": 0, "completion": 0, "cost": 0}
        return totals[key]

    if deployment_public_id is None or job_public_id is None:
        for values in _compute(organization_id, project_id, start, end, group_by, job_public_id, deployment_public_id):
            totals_row = row(tuple(_key(values, key, _COMPUTE_FIELDS) for key in group_by))
            totals_row["gpu"] += float(values["gpu"] or 0)
            totals_row["cpu"] += float(values["cpu"] or 0)
            totals_row["memory"] += float(values["memory"] or 0)
            totals_row["cost"] += int(values["cost"] or 0)
    if job_public_id is None:
        for values in _tokens(organization_id, project_id, start, end, group_by, deployment_public_id):
            totals_row = row(tuple(_key(values, key, _TOKEN_FIELDS) for key in group_by))
            totals_row["requests"] += values["requests"]
            totals_row["prompt"] += int(values["prompt"] or 0)
            totals_row["completion"] += int(values["completion"] or 0)
            totals_row["cost"] += int(values["cost"] or 0)
    result = []
    for key in sorted(totals, key=lambda key: tuple((value is None, value or "") for value in key))[:MAX_USAGE_ROWS]:
        sums = totals[key]
        item: dict[str, Any] = {GROUP_KEYS[name]: value for name, value in zip(group_by, key, strict=True)}
        item.update(
            gpu_seconds=sums["gpu"], cpu_seconds=sums["cpu"], memory_gb_seconds=sums["memory"], requests=sums["requests"], prompt_tokens=sums["prompt"],
            completion_tokens=sums["completion"], cost_usd=micro_to_usd(sums["cost"]),
        )
        result.append(item)
    return result


def _key(values: dict, name: str, fields: dict[str, str]) -> str | None:
    """Return the value of grouping ``name`` of one ledger's row (a fixed one where that ledger
    has no such field)."""
    if name == "resource" and "resource" not in fields:
        return TOKENS_RESOURCE
    if name not in fields:
        return None
    value = values[fields[name]]
    if name == "day":
        return value.isoformat()
    return value or None  # compute billed to no job, or no deployment's, has an empty id


def _compute(organization_id, project_id, start, end, group_by, job_public_id, deployment_public_id=None):
    """Sum compute intervals per group (one query)."""
    queryset = UsageInterval.objects.unscoped().filter(organization_id=organization_id, ended_at__gte=start, ended_at__lt=end)
    if project_id is not None:
        queryset = queryset.filter(project_id=project_id)
    if job_public_id is not None:
        queryset = queryset.filter(job_public_id=job_public_id)
    if deployment_public_id is not None:
        queryset = queryset.filter(deployment_public_id=deployment_public_id)
    if "day" in group_by:
        queryset = queryset.annotate(day=TruncDate("ended_at"))
    fields = [_COMPUTE_FIELDS[key] for key in group_by if key in _COMPUTE_FIELDS]
    return (
        queryset.values(*fields)
        .annotate(gpu=Sum("gpu_seconds"), cpu=Sum("cpu_seconds"), memory=Sum("memory_gb_seconds"), cost=Sum("cost_micro_usd"))
        .order_by(*fields)[:MAX_USAGE_ROWS]
    )


def _tokens(organization_id, project_id, start, end, group_by, deployment_public_id):
    """Sum served tokens per group (one query)."""
    queryset = TokenUsage.objects.unscoped().filter(organization_id=organization_id, created_at__gte=start, created_at__lt=end)
    if project_id is not None:
        queryset = queryset.filter(project_id=project_id)
    if deployment_public_id is not None:
        queryset = queryset.filter(deployment_public_id=deployment_public_id)
    if "day" in group_by:
        queryset = queryset.annotate(day=TruncDate("created_at"))
    fields = [_TOKEN_FIELDS[key] for key in group_by if key in _TOKEN_FIELDS]
    return (
        queryset.values(*fields)
        .annotate(requests=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"), cost=Sum("cost_micro_usd"))
        .order_by(*fields)[:MAX_USAGE_ROWS]
    )


def default_range(now: datetime) -> tuple[datetime, datetime]:
    """Return the range ``GET /usage`` covers without ``start``/``end``: the last 30 days to now."""
    return now - timedelta(days=30), now
