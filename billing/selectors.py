"""Reads of the usage ledger: usage summed by day, resource and job over a time range."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Sum
from django.db.models.functions import TruncDate

from billing.models import UsageInterval
from billing.pricing import micro_to_usd

#: What ``GET /usage`` may group by, and the row key each grouping adds.
GROUP_KEYS = {"day": "date", "resource": "resource", "job": "job_id"}
_FIELDS = {"day": "day", "resource": "resource_type", "job": "job_public_id"}
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
) -> list[dict[str, Any]]:
    """Return usage summed per group for intervals that ended in [start, end).

    ``group_by`` holds keys of ``GROUP_KEYS``; each row has those keys (``date`` as
    ``YYYY-MM-DD`` UTC, ``resource`` the GPU type or ``cpu``, ``job_id``) and ``gpu_seconds``,
    ``cpu_seconds`` (floats) and ``cost_usd`` (exact Decimal). ``project_id`` None means the whole
    organization. Rows are ordered by their keys.
    """
    queryset = UsageInterval.objects.unscoped().filter(organization_id=organization_id, ended_at__gte=start, ended_at__lt=end)
    if project_id is not None:
        queryset = queryset.filter(project_id=project_id)
    if job_public_id is not None:
        queryset = queryset.filter(job_public_id=job_public_id)
    if "day" in group_by:
        queryset = queryset.annotate(day=TruncDate("ended_at"))
    fields = [_FIELDS[key] for key in group_by]
    rows = (
        queryset.values(*fields)
        .annotate(gpu=Sum("gpu_seconds"), cpu=Sum("cpu_seconds"), cost=Sum("cost_micro_usd"))
        .order_by(*fields)[:MAX_USAGE_ROWS]
    )
    result = []
    for row in rows:
        item: dict[str, Any] = {}
        for key in group_by:
            value = row[_FIELDS[key]]
            item[GROUP_KEYS[key]] = value.isoformat() if key == "day" else value
        item.update(gpu_seconds=float(row["gpu"] or 0), cpu_seconds=float(row["cpu"] or 0), cost_usd=micro_to_usd(row["cost"] or 0))
        result.append(item)
    return result


def default_range(now: datetime) -> tuple[datetime, datetime]:
    """Return the range ``GET /usage`` covers without ``start``/``end``: the last 30 days to now."""
    return now - timedelta(days=30), now
