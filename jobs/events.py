"""Recording a job's events, and every webhook payload they make.

``job_record_event`` appends a JobEvent in the caller's transaction (``jobs.services`` for status
changes, the checkpoint and adapter lifecycles, the reconciler), numbers it in the job's live
stream (``jobs.stream``), and hands the webhook outbox (``jobs.webhooks.outbox``) the finished
payload for the endpoints subscribed to its type (``webhook_data``). ``events_recorded_together``
holds events back to store them for many jobs at once.

Imports run down from here: to the stream, the outbox and the presenters (``jobs.serializers``),
never up to the services that call it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from jobs.artifacts.kinds import KINDS
from jobs.models import EventLevel, Job, JobEvent
from jobs.serializers import job_to_dict
from jobs.stream import records as stream_records
from jobs.stream.fanout import publish_on_commit
from jobs.webhooks import outbox


def webhook_data(event: JobEvent) -> dict[str, Any]:
    """Return the ``data`` of ``event``'s webhook message (docs/webhooks.md): the Job object as it
    is now for ``job.*`` events, ``{"job_id", "<kind>_id", "step", "download_url"}`` for an
    artifact's ``<kind>.ready`` (``checkpoint.ready``, ``adapter.ready``; ids and step from the
    event's data)."""
    job = event.job
    for kind in KINDS:
        if event.type == kind.ready_event:
            public_id = event.data.get(kind.id_field)
            return {
                "job_id": job.public_id,
                kind.id_field: public_id,
                "step": event.data.get("step"),
                "download_url": kind.download_url(public_id),
            }
    return job_to_dict(job)


def _enqueue_webhook(event: JobEvent) -> None:
    """Write the outbox rows of a just-stored ``event`` (inside its transaction): its payload goes
    to every enabled endpoint of the job's project subscribed to its type; nothing is built when
    none is."""
    job = event.job
    endpoints = outbox.subscribed_endpoints(project_id=job.project_id, type=event.type)
    if not endpoints:
        return
    outbox.publish(
        project_id=job.project_id,
        type=event.type,
        data=webhook_data(event),
        endpoints=endpoints,
        created_at=event.created_at,
        public_id=event.public_id,
        job_event=event,
    )


# No savepoint of its own: the event belongs to the caller's change, which fails with it.
@transaction.atomic(savepoint=False)
def job_record_event(
    *,
    job: Job,
    type: str,
    message: str = "",
    level: str = EventLevel.INFO,
    data: dict[str, Any] | None = None,
    status_change: bool = False,
) -> JobEvent:
    """Append a JobEvent to ``job`` (call inside the transaction that made the change).

    The event joins the job's live stream; with ``status_change`` (``job`` already holds its new
    status) the Job object as it is now follows it as a ``status`` record. The webhook outbox
    rows are written in the same transaction.
    """
    batch: EventBatch | None = getattr(_recording, "batch", None)
    # Held back, the event is stored later: its job as it is now goes with it (webhook message).
    event = JobEvent(job=job if batch is None else copy.copy(job), type=type, level=level, message=message,
                     data=data or {})
    if status_change:
        event.job_snapshot = job_to_dict(job)
    if batch is not None:
        batch.add(event)
        return event
    # A status change takes two numbers: the event's, and the status record's right after it.
    event.stream_seq = stream_records.allocate(job.pk, 2 if status_change else 1)
    event.save(force_insert=True)
    _enqueue_webhook(event)
    publish_on_commit(job.public_id, stream_records.event_records([event]))
    return event


_recording = threading.local()


class EventBatch:
    """The JobEvents ``job_record_event`` holds back inside ``events_recorded_together``, by job,
    in the order they were recorded."""

    def __init__(self) -> None:
        self._pending: dict[int, list[JobEvent]] = {}

    def add(self, event: JobEvent) -> None:
        """Hold ``event`` back until the batch is written."""
        self._pending.setdefault(event.job_id, []).append(event)

    def write_job(self, job_id: int) -> None:
        """Store the events held back for ``job_id`` now (``jobs.stream.records.held_back``)."""
        if job_id in self._pending:
            self._write({job_id: self._pending.pop(job_id)})

    def write(self) -> None:
        """Store every event held back."""
        pending, self._pending = self._pending, {}
        self._write(pending)

    @staticmethod
    def _write(pending: dict[int, list[JobEvent]]) -> None:
        """Number the events (one statement for all their jobs; a status change takes two
        numbers, as in ``job_record_event``), insert them in one statement, then write their
        webhook outbox rows and publish them on commit, event by event as recorded."""
        if not pending:
            return
        firsts = stream_records.allocate_many(
            {job_id: sum(2 if event.job_snapshot is not None else 1 for event in events)
             for job_id, events in pending.items()}
        )
        ordered = []
        for job_id, events in pending.items():
            seq = firsts[job_id]
            for event in events:
                event.stream_seq = seq
                seq += 2 if event.job_snapshot is not None else 1
                ordered.append(event)
        JobEvent.objects.bulk_create(ordered)
        for event in ordered:
            _enqueue_webhook(event)
            publish_on_commit(event.job.public_id, stream_records.event_records([event]))


@contextmanager
def events_recorded_together() -> Iterator[EventBatch]:
    """Hold back the JobEvents recorded inside the block (in this thread) and store them when it
    ends, for a caller that records events for many jobs in one transaction (the reconciler
    finishing a batch of jobs): their stream numbers are taken in one ``UPDATE``, the rows
    inserted in one ``INSERT``, instead of two statements per event.

    Each event takes the same numbers and place as it would have at once: the caller holds its
    jobs' row locks until commit, and a job's other stream rows numbered inside the block
    (``jobs.stream.records.allocate``) first store the events held back for it. On an error in
    the block nothing is stored: the caller's transaction is to be rolled back (a savepoint
    inside the block would not take back the events held back meanwhile).
    """
    batch = EventBatch()
    outer = getattr(_recording, "batch", None)
    _recording.batch = batch
    try:
        with stream_records.held_back(batch.write_job):
            yield batch
            _recording.batch = outer  # what writing the batch records is not held back
            batch.write()
    finally:
        _recording.batch = outer
