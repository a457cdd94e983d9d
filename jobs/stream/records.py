"""Numbering, encoding and reading the records of a job's live stream.

A record is one Server-Sent Event (WHATWG HTML, "Server-sent events"): ``id:`` the record's
number in its job's sequence, ``event:`` its kind, ``data:`` one line of JSON (docs/live-stream.md).
Writers number their rows with :func:`number` inside the transaction that stores them and hand
the records to :func:`jobs.stream.fanout.publish_on_commit`; readers get them back from the
database with :func:`read_after`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection, models

from jobs.models import CheckpointChange, Job, JobEvent, LogLine, MetricStep, RolloutSample
from jobs.serializers import (
    event_to_dict,
    log_line_to_dict,
    metric_point_to_dict,
    sample_to_dict,
)

#: The kinds of record, as the ``event:`` field names them.
STATUS, METRICS, SAMPLE, CHECKPOINT, LOG, EVENT = "status", "metrics", "sample", "checkpoint", "log", "event"


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One event of the stream: ``seq`` (``None`` for the connection's opening snapshot),
    ``event`` (a kind above) and ``data``, the JSON text of its object."""

    seq: int | None
    event: str
    data: str

    def frame(self) -> str:
        """Return the event as ``text/event-stream`` text, blank line included."""
        head = f"id: {self.seq}\n" if self.seq is not None else ""
        return f"{head}event: {self.event}\ndata: {self.data}\n\n"

    def as_list(self) -> list:
        """Return ``[seq, event, data]``, the record's form on Redis pub/sub."""
        return [self.seq, self.event, self.data]


def encode(value: Any) -> str:
    """Return ``value`` as compact JSON on one line (newlines inside strings are escaped)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def record(seq: int | None, event: str, value: Any) -> StreamRecord:
    """Return the record of ``value`` (a JSON-ready object) as event ``event`` number ``seq``."""
    return StreamRecord(seq, event, encode(value))


def allocate(job_id: int, count: int) -> int:
    """Take the next ``count`` numbers of the job's sequence; return the first.

    Must run inside the transaction that stores the numbered rows: the ``UPDATE`` locks the
    job row until commit, so numbers reach readers in commit order. Raises ``RuntimeError``
    outside a transaction.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("stream numbers must be taken inside the transaction that stores the rows")
    write_held_back = getattr(_held_back, "write", None)
    if write_held_back is not None:  # rows recorded earlier come first: they take their numbers now
        write_held_back(job_id)
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET stream_seq = stream_seq + %s WHERE id = %s RETURNING stream_seq", [count, job_id]
        )
        (last,) = cursor.fetchone()
    return last - count + 1


def allocate_many(counts: Mapping[int, int]) -> dict[int, int]:
    """Take the next ``counts[job_id]`` numbers of each job's sequence in one ``UPDATE ... FROM``
    a ``VALUES`` list ``RETURNING`` the new ends; return the first number taken for each job. The
    caller holds the jobs' row locks (taken in its own order, so this statement waits for none)
    and stores the numbered rows in the same transaction, as for ``allocate``. The statement runs
    on PostgreSQL and SQLite alike: a named CTE typed with standard ``CAST``s (SQLite has no
    ``::`` casts nor column names on a subquery's alias), ``RETURNING`` the job's own columns
    unqualified."""
    if not counts:
        return {}
    if not connection.in_atomic_block:
        raise RuntimeError("stream numbers must be taken inside the transaction that stores the rows")
    rows, params = [], []
    for job_id, count in counts.items():
        rows.append("(CAST(%s AS bigint), CAST(%s AS bigint))")
        params += [job_id, count]
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH taken(job_id, amount) AS (VALUES {', '.join(rows)}) "
            f"UPDATE {table} AS job SET stream_seq = job.stream_seq + taken.amount "
            "FROM taken WHERE job.id = taken.job_id RETURNING id, stream_seq",
            params,
        )
        last = dict(cursor.fetchall())
    return {job_id: last[job_id] - count + 1 for job_id, count in counts.items()}


_held_back = threading.local()


@contextmanager
def held_back(write: Callable[[int], None]) -> Iterator[None]:
    """Inside the block (in this thread), rows a writer holds back to number later for many jobs
    at once (``jobs.events.EventBatch``) keep their place in each job's sequence: before
    ``allocate`` takes numbers for a job, ``write(job_id)`` stores that job's held-back rows."""
    outer = getattr(_held_back, "write", None)
    _held_back.write = write
    try:
        yield
    finally:
        _held_back.write = outer


def number(job_id: int, rows: Sequence[models.Model]) -> None:
    """Give each of ``rows`` (unsaved or about to be saved) the next number, in order."""
    if rows:
        first = allocate(job_id, len(rows))
        for offset, row in enumerate(rows):
            row.stream_seq = first + offset


def metric_records(rows: Iterable[MetricStep]) -> list[StreamRecord]:
    """Return the ``metrics`` records of numbered metric rows."""
    return [
        record(row.stream_seq, METRICS, metric_point_to_dict(row.step, row.time, row.attempt, row.values))
        for row in rows
    ]


def sample_records(rows: Iterable[RolloutSample]) -> list[StreamRecord]:
    """Return the ``sample`` records of numbered rollout samples."""
    return [record(row.stream_seq, SAMPLE, sample_to_dict(row)) for row in rows]


def log_records(rows: Iterable[LogLine]) -> list[StreamRecord]:
    """Return the ``log`` records of stored (numbered, with ids) log lines."""
    return [
        record(row.stream_seq, LOG, log_line_to_dict(row.pk, row.time, row.attempt, row.stream, row.line))
        for row in rows
    ]


def event_records(events: Iterable[JobEvent]) -> list[StreamRecord]:
    """Return the ``event`` record of each numbered JobEvent, followed by its ``status``
    record (number + 1) when the event is a status change."""
    records = []
    for event in events:
        records.append(record(event.stream_seq, EVENT, event_to_dict(event)))
        if event.job_snapshot is not None:
            records.append(record(event.stream_seq + 1, STATUS, event.job_snapshot))
    return records


def checkpoint_records(changes: Iterable[CheckpointChange]) -> list[StreamRecord]:
    """Return the ``checkpoint`` records of checkpoint changes (each the Checkpoint object as it was)."""
    return [StreamRecord(change.stream_seq, CHECKPOINT, encode(change.snapshot)) for change in changes]


# Every table that holds stream records, how to read it and how to turn its rows into records.
_SOURCES = (
    (MetricStep.objects.all(), metric_records),
    (RolloutSample.objects.all(), sample_records),
    (LogLine.objects.all(), log_records),
    (JobEvent.objects.select_related("job"), event_records),
    (CheckpointChange.objects.all(), checkpoint_records),
)


#: About how many bytes of record data one :func:`read_after` call returns (at least one record):
#: a sample can be 128 KiB of text, so 500 rows of each table could be hundreds of megabytes.
PAGE_BYTES = 4 * 1024 * 1024


def read_after(
    job_id: int, after: int, *, until: int | None = None, limit: int = 500, max_bytes: int = PAGE_BYTES
) -> tuple[list[StreamRecord], bool]:
    """Read the job's records numbered above ``after`` (and at most ``until``) from the database.

    Returns ``(records, complete)``: records in number order, and whether they reach the end
    (``False`` when more are left: call again after the last number returned). At most
    ``limit`` rows are read from each table per call, and reading stops once about
    ``max_bytes`` of record data is in hand.
    """
    batches: list[list[StreamRecord]] = []
    horizon: int | None = until
    budget = max_bytes
    for queryset, to_records in _SOURCES:
        # An event numbered ``after`` may carry the status record ``after + 1``.
        floor = {"stream_seq__gte": after} if queryset.model is JobEvent else {"stream_seq__gt": after}
        rows = queryset.filter(job_id=job_id, **floor)
        if until is not None:
            rows = rows.filter(stream_seq__lte=until)
        taken: list[StreamRecord] = []
        count, last, cut = 0, None, None
        for row in rows.order_by("stream_seq")[:limit].iterator(chunk_size=50):
            converted = to_records([row])
            taken += converted
            count, last = count + 1, row.stream_seq
            budget -= sum(len(item.data) for item in converted)
            if budget <= 0 and last > after:
                cut = last  # enough for this call: the rest of this table waits for the next
                break
        if cut is None and count == limit:
            cut = last  # this table may hold more
        if cut is not None:
            # Nothing past the last row read from a table cut short is known to be complete.
            horizon = cut if horizon is None else min(horizon, cut)
        batches.append(taken)
    complete = horizon is None or horizon == until
    merged = sorted((item for batch in batches for item in batch if item.seq > after), key=lambda item: item.seq)
    if horizon is not None:
        # A status record (event number + 1) travels with its event.
        merged = [item for item in merged if item.seq <= horizon or (item.event == STATUS and item.seq == horizon + 1)]
    return merged, complete
