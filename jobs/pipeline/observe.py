"""Observing: what the launcher says of a batch of launched attempts, asked with no row locked.

``launched_attempts`` reads the current launched attempts of some jobs in one query, ``look``
asks the launcher about all of them at once and reads their captured output, and
``idle_jobs`` picks the jobs a pass has nothing to apply to (so it skips their locks).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, FloatField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from billing.ledger import organizations_exhausted
from jobs.launchers.base import AttemptPhase, CapturedLine, Launcher, Observation
from jobs.models import AttemptState, JobAttempt, JobStatus

S = JobStatus


@dataclass
class Seen:
    """What the launcher said of one launched attempt, asked while no row was locked."""

    attempt_id: int
    observation: Observation
    lines: list[CapturedLine]
    handle: dict
    handle_changed: bool = False


def look(launcher, attempts: list[Launched]) -> dict[int, Seen]:
    """Observe ``attempts`` (launched ones) and read their captured output, holding no lock."""
    observations = launcher.observe_many([attempt.handle for attempt in attempts])
    # A launcher that captures no output (Launcher's own captured_lines) notes no progress in a
    # handle: its handles are not copied to be compared.
    captures = type(launcher).captured_lines is not Launcher.captured_lines
    seen = {}
    for attempt, observation in zip(attempts, observations):
        if not captures:
            seen[attempt.job_id] = Seen(attempt.pk, observation, [], attempt.handle)
            continue
        handle = copy.deepcopy(attempt.handle)
        lines = launcher.captured_lines(handle)
        seen[attempt.job_id] = Seen(attempt.pk, observation, lines, handle, handle != attempt.handle)
    return seen


@dataclass(frozen=True, slots=True)
class Launched:
    """A launched current attempt as a pass reads it (``launched_attempts``): the attempt's own
    fields, and of its job the status, start, organization and the spec's
    ``max_runtime_minutes`` (minutes)."""

    pk: int
    job_id: int
    number: int
    handle: dict
    launched_at: datetime | None
    last_heartbeat_at: datetime | None
    stop_requested_at: datetime | None
    job_status: str
    job_started_at: datetime | None
    organization_id: int
    max_runtime_minutes: float | None


def launched_attempts(job_ids: list[int]) -> list[Launched]:
    """Return the current attempt of each of ``job_ids`` that is launched, with what a pass reads
    of its job (one query, rows rather than model instances: a pass reads 1,000 of them); the
    spec itself, the largest column, is left in the database."""
    rows = (
        JobAttempt.objects.filter(job_id__in=job_ids, state=AttemptState.LAUNCHED, number=F("job__attempt"))
        .annotate(max_runtime_minutes=Cast(KeyTextTransform("max_runtime_minutes", "job__spec"), FloatField()))
        .values_list("pk", "job_id", "number", "handle", "launched_at", "last_heartbeat_at", "stop_requested_at",
                     "job__status", "job__started_at", "job__project__organization_id", "max_runtime_minutes")
    )
    return [Launched(*row) for row in rows]


def idle_jobs(attempts: list[Launched], seen: dict[int, Seen], closings: dict[int, datetime], now) -> set[int]:
    """Return the ids of the jobs for which ``apply_seen`` would do nothing now, so a pass skips
    their lock: running, its attempt still running with no captured output (nor read progress),
    no stop asked, heard from within the heartbeat timeout, inside its runtime, no usage
    interval due (``closings``: when each running attempt's next interval ends, as
    ``close_due_usage`` returns them) and its organization not out of credit. Read without
    locks; a job wrongly left out is applied."""
    candidates = {}
    for attempt in attempts:
        look = seen.get(attempt.job_id)
        if (
            look is None or look.lines or look.handle_changed or look.observation.phase != AttemptPhase.RUNNING
            or attempt.job_status != S.RUNNING or attempt.stop_requested_at is not None or attempt.job_started_at is None
        ):
            continue
        started_at = look.observation.started_at or attempt.launched_at
        last_sign_of_life = attempt.last_heartbeat_at or max(attempt.launched_at, started_at)
        if now - last_sign_of_life > timedelta(seconds=settings.LAB_HEARTBEAT_TIMEOUT_S):
            continue
        if now - attempt.job_started_at > timedelta(minutes=attempt.max_runtime_minutes):
            continue
        candidates[attempt.pk] = (attempt, started_at)
    if not candidates:
        return set()
    exhausted = organizations_exhausted(attempt.organization_id for attempt, _ in candidates.values())
    return {
        attempt.job_id
        for attempt_id, (attempt, _) in candidates.items()
        if closings[attempt_id] > now and attempt.organization_id not in exhausted
    }
