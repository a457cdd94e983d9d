"""Reads of jobs, always within one project."""

from __future__ import annotations

from collections.abc import Mapping

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTextTransform

from jobs.models import Job, JobStatus
from lab.api.errors import ApiError, FieldError
from lab.models import Project


def job_list(*, project: Project, status: str | None = None, metadata: Mapping[str, str] | None = None) -> QuerySet:
    """Return ``project``'s jobs, optionally of one ``status`` and with every ``metadata`` pair.

    Raises ApiError 400 for an unknown status.
    """
    jobs = Job.objects.filter(project=project)
    if status:
        if status not in JobStatus.values:
            raise ApiError(
                400,
                "invalid_request",
                f"Unknown status {status[:40]!r}; use one of {', '.join(JobStatus.values)}.",
                errors=[FieldError("status", "invalid_value", "unknown status")],
            )
        jobs = jobs.filter(status=status)
    for index, (key, value) in enumerate((metadata or {}).items()):
        # KeyTextTransform takes the key literally, so keys with "__" or dots are safe.
        alias = f"metadata_{index}"
        jobs = jobs.alias(**{alias: KeyTextTransform(key, "metadata")}).filter(**{alias: value})
    return jobs


def metadata_filters(params: Mapping[str, str]) -> dict[str, str]:
    """Return the ``metadata[key]=value`` pairs of a query string (at most 16, keys ≤ 64 chars)."""
    pairs = {}
    for name, value in params.items():
        if name.startswith("metadata[") and name.endswith("]"):
            key = name[len("metadata[") : -1]
            if not key or len(key) > 64 or len(value) > 512:
                raise ApiError(400, "invalid_request", "metadata filters take keys of 1-64 and values of at most 512 characters.", param=name[:80])
            pairs[key] = value
    if len(pairs) > 16:
        raise ApiError(400, "invalid_request", "At most 16 metadata filters.", param="metadata")
    return pairs
