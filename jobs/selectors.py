"""Reads of jobs, always within one project."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast

from jobs.models import Job, JobKind, JobStatus, LogLine, MetricStep, RolloutSample
from jobs.serializers import log_line_to_dict, metric_point_to_dict, sample_to_dict
from lab.errors import FieldError, LabError
from lab.models import Project
from lab.paging import int_param, list_envelope

#: The most ``[[env]]`` blocks a spec has (labsdk.spec.model.JobSpec.env).
MAX_SPEC_ENVIRONMENTS = 16


def job_list(
    *,
    project: Project,
    status: str | None = None,
    metadata: Mapping[str, str] | None = None,
    model: str | None = None,
    environment: str | None = None,
    kind: str | None = JobKind.TRAINING,
) -> QuerySet:
    """Return ``project``'s jobs of one ``kind`` (``JobKind``; training jobs unless asked, None
    for every kind), optionally of one ``status``, with every ``metadata`` pair, on one base
    ``model`` (its catalogue id) and training on one ``environment`` (an id as stored,
    ``owner/name@version``, or without the version: any version of it).

    Raises LabError ``invalid_request`` for an unknown status or kind.
    """
    jobs = Job.objects.filter(project=project)
    if kind is not None:
        if kind not in JobKind.values:
            raise LabError(
                "invalid_request",
                f"Unknown kind {kind[:40]!r}; use one of {', '.join(JobKind.values)}.",
                errors=[FieldError("kind", "invalid_value", "unknown kind")],
            )
        jobs = jobs.filter(kind=kind)
    if status:
        if status not in JobStatus.values:
            raise LabError(
                "invalid_request",
                f"Unknown status {status[:40]!r}; use one of {', '.join(JobStatus.values)}.",
                errors=[FieldError("status", "invalid_value", "unknown status")],
            )
        jobs = jobs.filter(status=status)
    for index, (key, value) in enumerate((metadata or {}).items()):
        # KeyTextTransform takes the key literally, so keys with "__" or dots are safe; the cast
        # makes the comparison a plain text one on every database (SQLite would parse the value
        # as JSON otherwise).
        alias = f"metadata_{index}"
        value_of_key = Cast(KeyTextTransform(key, "metadata"), output_field=TextField())
        jobs = jobs.alias(**{alias: value_of_key}).filter(**{alias: value})
    if model:
        jobs = jobs.alias(spec_model=Cast(KeyTextTransform("model", "spec"), output_field=TextField())).filter(spec_model=model)
    if environment:
        jobs = _training_on(jobs, environment)
    return jobs


def _training_on(jobs: QuerySet, environment: str) -> QuerySet:
    """Keep the jobs one of whose ``spec.env[i].id`` is ``environment`` (or ``environment@...``).
    One text comparison per block index: JSON containment has no SQLite form."""
    matches = Q()
    for index in range(MAX_SPEC_ENVIRONMENTS):
        alias = f"env_id_{index}"
        block_id = KeyTextTransform("id", KeyTransform(str(index), KeyTransform("env", "spec")))
        jobs = jobs.alias(**{alias: Cast(block_id, output_field=TextField())})
        matches |= Q(**{alias: environment}) | Q(**{f"{alias}__startswith": f"{environment}@"})
    return jobs.filter(matches)


def job_eta_seconds(job: Job, *, now) -> float | None:
    """Return the seconds a running job needs for its remaining steps at its pace so far (the
    time since it started over the steps done); None before its first step or when not running."""
    if job.status != JobStatus.RUNNING or not job.started_at or not job.step or job.step >= job.max_steps:
        return None
    elapsed = (now - job.started_at).total_seconds()
    return max(0.0, elapsed / job.step * (job.max_steps - job.step))


def metadata_filters(params: Mapping[str, str]) -> dict[str, str]:
    """Return the ``metadata[key]=value`` pairs of a query string (at most 16, keys ≤ 64 chars)."""
    pairs = {}
    for name, value in params.items():
        if name.startswith("metadata[") and name.endswith("]"):
            key = name[len("metadata[") : -1]
            if not key or len(key) > 64 or len(value) > 512:
                raise LabError("invalid_request", "metadata filters take keys of 1-64 and values of at most 512 characters.", param=name[:80])
            pairs[key] = value
    if len(pairs) > 16:
        raise LabError("invalid_request", "At most 16 metadata filters.", param="metadata")
    return pairs


def metric_points(*, job: Job, params: Mapping[str, str]) -> dict:
    """Return the list body of ``GET /jobs/{id}/metrics``.

    ``after_step`` (exclusive), ``names`` (comma-separated; others are left out of ``values``),
    ``limit`` (1-10,000 points per page, default 1,000) and ``max_points``: when set, the whole
    range after ``after_step`` is downsampled to at most that many points by splitting it into
    buckets and keeping, in each bucket, the points that hold each name's minimum and maximum
    (so spikes survive, as in M4/min-max decimation for line charts).
    """
    after_step = int_param(params, "after_step", minimum=-1, maximum=10**9, default=-1)
    limit = int_param(params, "limit", minimum=1, maximum=10_000, default=1000)
    max_points = int_param(params, "max_points", minimum=2, maximum=10_000, default=None)
    raw_names = params.get("names") or ""
    names = [name for name in raw_names.split(",") if name][:100]
    rows = MetricStep.objects.filter(job=job, step__gt=after_step).order_by("step")

    def serialize(step: int, time, attempt: int, values: dict) -> dict:
        if names:
            values = {name: values[name] for name in names if name in values}
        return metric_point_to_dict(step, time, attempt, values)

    if max_points is None:
        page = list(rows.values_list("step", "time", "attempt", "values")[: limit + 1])
        return list_envelope((serialize(*row) for row in page[:limit]), has_more=len(page) > limit)
    all_rows = list(rows.values_list("step", "time", "attempt", "values"))
    return list_envelope((serialize(*row) for row in downsample(all_rows, names, max_points)), has_more=False)


def downsample(rows: list[tuple], names: list[str], max_points: int) -> list[tuple]:
    """Keep at most ``max_points`` of ``rows`` ((step, time, attempt, values) in step order).

    The first and last rows always stay; the rows between are split into buckets and each bucket
    keeps the rows holding each tracked name's minimum and maximum (min-max decimation, so spikes
    survive). Tracked names are ``names``, or the first row's names (at most 8).
    """
    if len(rows) <= max_points:
        return rows
    tracked = names or sorted(rows[0][3])[:8]
    per_bucket = max(2, 2 * len(tracked))
    interior = range(1, len(rows) - 1)
    buckets = max(1, (max_points - 2) // per_bucket)
    size = -(-len(interior) // buckets)
    keep: set[int] = set()
    for start in range(interior.start, interior.stop, size):
        indexes = range(start, min(start + size, interior.stop))
        for name in tracked:
            present = [index for index in indexes if name in rows[index][3]]
            if present:
                keep.add(min(present, key=lambda index: rows[index][3][name]))
                keep.add(max(present, key=lambda index: rows[index][3][name]))
    middle, room = sorted(keep), max_points - 2
    if len(middle) > room:
        # More extremes than room (few points asked for many names): thin them evenly.
        middle = [middle[int(index * len(middle) / room)] for index in range(room)]
    return [rows[0], *(rows[index] for index in middle), rows[-1]]


def job_samples(*, job: Job, params: Mapping[str, str]) -> dict:
    """Return the list body of ``GET /jobs/{id}/samples?step=`` (default: the latest step with samples)."""
    step = int_param(params, "step", minimum=0, maximum=10**9, default=None)
    limit = int_param(params, "limit", minimum=1, maximum=1000, default=100)
    samples = RolloutSample.objects.filter(job=job)
    if step is None:
        step = samples.order_by("-step").values_list("step", flat=True).first()
    page = list(samples.filter(step=step).order_by("group", "id")[: limit + 1]) if step is not None else []
    return list_envelope((sample_to_dict(sample) for sample in page[:limit]), has_more=len(page) > limit)


def job_logs(*, job: Job, params: Mapping[str, str]) -> dict:
    """Return the list body of ``GET /jobs/{id}/logs?after=`` in order (``seq`` increases)."""
    after = int_param(params, "after", minimum=0, maximum=2**62, default=0)
    limit = int_param(params, "limit", minimum=1, maximum=1000, default=100)
    page = list(
        LogLine.objects.filter(job=job, pk__gt=after)
        .order_by("pk")
        .values_list("pk", "time", "attempt", "stream", "line")[: limit + 1]
    )
    return list_envelope((log_line_to_dict(*row) for row in page[:limit]), has_more=len(page) > limit)


def jobs_with_latest_reward(jobs: QuerySet) -> QuerySet:
    """Annotate each of ``jobs`` with ``latest_reward``: ``reward/mean`` of its highest step that has it.

    ``latest_reward`` is a float, or None before the first step with a reward. One subquery per
    row, served by the (job, step) unique index.
    """
    from django.db.models import FloatField, OuterRef, Subquery

    latest = (
        MetricStep.objects.filter(job=OuterRef("pk"), values__has_key="reward/mean")
        .order_by("-step")
        .annotate(reward=Cast(KeyTextTransform("reward/mean", "values"), output_field=FloatField()))
        .values("reward")[:1]
    )
    return jobs.annotate(latest_reward=Subquery(latest, output_field=FloatField()))


def metric_names(*, job: Job) -> list[str]:
    """Return every metric name ``job`` has stored at least once, sorted."""
    from django.db import connection

    table = MetricStep._meta.db_table
    if connection.vendor == "postgresql":
        sql = f'SELECT DISTINCT jsonb_object_keys("values") FROM {table} WHERE job_id = %s'
    else:
        sql = f'SELECT DISTINCT json_each.key FROM {table}, json_each({table}."values") WHERE job_id = %s'
    with connection.cursor() as cursor:
        cursor.execute(sql, [job.pk])
        return sorted(row[0] for row in cursor.fetchall())


def sample_steps(*, job: Job, limit: int = 1000) -> list[int]:
    """Return the steps that have rollout samples, newest first (at most ``limit``)."""
    return list(
        RolloutSample.objects.filter(job=job).order_by("-step").values_list("step", flat=True).distinct()[:limit]
    )


def job_logs_tail(*, job: Job, limit: int = 200, contains: str = "", since: datetime | None = None) -> list[dict]:
    """Return ``job``'s last ``limit`` log lines in order, each as in ``GET /jobs/{id}/logs``.

    ``contains`` keeps only lines holding that text (case-sensitive); ``since`` only lines
    logged at or after that moment.
    """
    lines = LogLine.objects.filter(job=job)
    if contains:
        lines = lines.filter(line__contains=contains)
    if since is not None:
        lines = lines.filter(time__gte=since)
    rows = list(lines.order_by("-pk").values_list("pk", "time", "attempt", "stream", "line")[:limit])
    return [log_line_to_dict(*row) for row in reversed(rows)]


def job_samples_page(*, job: Job, step: int, page: int, limit: int) -> tuple[list[dict], int]:
    """Return one page of ``job``'s rollout samples of ``step`` (as in ``GET /jobs/{id}/samples``,
    by group then arrival) and how many samples that step has in all; ``page`` counts from 1."""
    samples = RolloutSample.objects.filter(job=job, step=step).order_by("group", "id")
    offset = (page - 1) * limit
    return [sample_to_dict(sample) for sample in samples[offset : offset + limit]], samples.count()

