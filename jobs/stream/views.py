"""``GET /api/v1/jobs/{id}/stream``: a job's records as Server-Sent Events (docs/live-stream.md).

An async view, served by the ASGI server without a thread per client. Every connection opens
with a ``status`` snapshot (no ``id:``), replays the records after the resume point from the
database, then follows live: from Redis pub/sub when ``REDIS_URL`` is set, else by polling
the database. Every database read runs in a worker thread that closes its connection
afterwards, so a waiting client holds no database connection. A comment line goes out every
``LAB_STREAM_HEARTBEAT_S`` seconds; the stream ends after the ``status`` event of a finished job.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.db import connections
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from jobs.models import TERMINAL_STATUSES, Job
from jobs.serializers import job_to_dict
from jobs.stream.fanout import Subscription, get_hub
from jobs.stream.records import STATUS, StreamRecord, read_after, record
from lab.api.auth import INVALID_API_KEY, api_key_from_authorization
from lab.api.errors import ApiError, error_json_response, not_found
from lab.errors import LabError
from lab.models import ApiKey, ApiKeyScope
from lab.tenancy import MAX_PUBLIC_ID, get_owned

_MAX_SEQ = 2**62


def _in_thread(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``function`` in a worker thread that closes its database connection afterwards."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(call, thread_sensitive=False)


def _find_job(
    *, authorization: str | None, user: Any, session_key: str | None, job_id: str
) -> tuple[Job, tuple[str, Any]]:
    """Return the job the caller may read, with the grant that allows it (see :func:`_allowed`):
    by API key (``read`` scope, its project) or by a dashboard session (a member of the job's
    organization). Raises ApiError 401/403/404."""
    if authorization is not None:
        api_key = api_key_from_authorization(authorization)
        if api_key is None:
            raise ApiError(401, "invalid_api_key", INVALID_API_KEY)
        if ApiKeyScope.READ not in api_key.scopes:
            raise ApiError(403, "insufficient_scope", "This API key lacks the 'read' scope.")
        return get_owned(Job.objects.all(), api_key.project, job_id, "job"), ("key", api_key.pk)
    if user is not None and user.is_authenticated:
        job = Job.objects.for_member(user).filter(public_id=job_id).first() if len(job_id) <= MAX_PUBLIC_ID else None
        if job is None:
            raise not_found("job")
        return job, ("session", session_key)
    raise ApiError(401, "invalid_api_key", INVALID_API_KEY)


def _allowed(grant: tuple[str, Any], job_pk: int) -> bool:
    """Whether the grant that opened the stream still allows reading the job: the API key still
    authenticates (not revoked, its creator still an owner or admin), or the session still exists (not logged out), its user is active (password
    unchanged) and still a member of the job's organization. A stream can last for hours."""
    kind, value = grant
    if kind == "key":
        return ApiKey.objects.authenticating().filter(pk=value).exists()
    request = SimpleNamespace(session=import_module(settings.SESSION_ENGINE).SessionStore(value))
    user = get_user(request)
    return (
        user.is_authenticated and Job.objects.for_member(user).filter(pk=job_pk).exists()
    )


def _bad_resume_point() -> ApiError:
    return ApiError(
        400, "invalid_request", "Last-Event-ID must be an event id this stream sent.", param="last_event_id"
    )


def _resume_point(request: HttpRequest) -> int | None:
    """Return the number to resume after (``Last-Event-ID`` header or ``?last_event_id=``),
    ``None`` for the whole history, or -1 for ``?from=now``. Raises ApiError 400."""
    raw = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id")
    start = request.GET.get("from")
    if start not in (None, "now", "start"):
        raise ApiError(400, "invalid_request", "from must be 'now' or 'start'.", param="from")
    if raw:
        # The length is checked before int(): int() refuses thousands of digits with a
        # ValueError, which would otherwise be a server error.
        if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > _MAX_SEQ:
            raise _bad_resume_point()
        return int(raw)
    return -1 if start == "now" else None


def _snapshot(job_pk: int) -> tuple[dict, int] | None:
    """Return the Job object and its last stream number, or ``None`` once the job is deleted."""
    job = Job.objects.unscoped().filter(pk=job_pk).first()  # the caller's access was checked
    return (job_to_dict(job), job.stream_seq) if job else None


def _catch_up(job_pk: int, after: int) -> tuple[list[StreamRecord], bool, bool]:
    """Return ``(records after `after`, complete, job still exists)``.

    Reads only up to the job's last committed number, taken first: the record tables are read
    one query after another, and records committed in between could otherwise show up in a
    later table with higher numbers than an earlier table's that the read missed (a step's
    metrics, then a log line), moving the follower past them for good. Every record up to that
    number was committed before it (numbers are taken under the job's row lock).
    """
    horizon = Job.objects.unscoped().filter(pk=job_pk).values_list("stream_seq", flat=True).first()
    if horizon is None:
        return [], True, False
    if after >= horizon:
        return [], True, True
    records, complete = read_after(job_pk, after, until=horizon)
    return records, complete, True


_snapshot_async = _in_thread(_snapshot)
_catch_up_async = _in_thread(_catch_up)
_gap_async = _in_thread(read_after)
_find_job_async = _in_thread(_find_job)
_allowed_async = _in_thread(_allowed)


@csrf_exempt  # read-only; any other method gets 405 in the API's error shape
async def job_stream(request: HttpRequest, job_id: str) -> HttpResponse:
    """Answer ``GET /api/v1/jobs/{id}/stream`` (API key or dashboard session)."""
    if request.method != "GET":
        response = error_json_response(ApiError(405, "method_not_allowed", f"Method {request.method} not allowed."))
        response["Allow"] = "GET"
        return response
    try:
        resume = _resume_point(request)
        authorization = request.headers.get("Authorization")
        user = None if authorization is not None else await request.auser()
        session_key = None if authorization is not None else request.session.session_key
        job, grant = await _find_job_async(
            authorization=authorization, user=user, session_key=session_key, job_id=job_id
        )
        if resume is not None and resume > job.stream_seq:
            # Not an id this stream sent (numbers only grow): following after it would skip
            # every record, the final status included, and never end.
            raise _bad_resume_point()
    except LabError as error:
        return error_json_response(error)
    response = StreamingHttpResponse(_events(job.pk, job.public_id, resume, grant), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
    return response


class _Follower:
    """The state of one connection: the last number sent and the job's last known status."""

    def __init__(self, job_pk: int):
        self.job_pk = job_pk
        self.last = 0
        self.finished = False
        self.exists = True

    def emit(self, records: list[StreamRecord]) -> list[str]:
        """Return the frames of the records not sent yet, remembering the last number."""
        frames = []
        for item in records:
            if item.seq is not None and item.seq <= self.last:
                continue
            frames.append(item.frame())
            if item.seq is not None:
                self.last = item.seq
            if item.event == STATUS:
                self.finished = json.loads(item.data).get("status") in TERMINAL_STATUSES
        return frames

    async def catch_up(self) -> AsyncIterator[str]:
        """Yield the frames of what the database holds after ``last``, a page at a time (a long
        history is never held in memory whole); sets ``exists``, whether the job still exists."""
        while True:
            records, complete, self.exists = await _catch_up_async(self.job_pk, self.last)
            for frame in self.emit(records):
                yield frame
            if complete or not records:
                return

    async def fill_gap(self, up_to: int) -> AsyncIterator[str]:
        """Yield the frames of the committed records numbered between ``last`` and ``up_to``
        (inclusive), a page at a time."""
        while self.last < up_to:
            records, complete = await _gap_async(self.job_pk, self.last, until=up_to)
            for frame in self.emit(records):
                yield frame
            if complete or not records:
                break


async def _events(
    job_pk: int, job_public_id: str, resume: int | None, grant: tuple[str, Any] | None = None
) -> AsyncIterator[str]:
    """Yield the connection's frames (see module doc); unsubscribes however it ends. With a
    ``grant``, the stream ends at the first heartbeat after it no longer allows reading the job."""
    hub = get_hub()
    subscription: Subscription | None = None
    if hub is not None:
        try:
            subscription = await hub.subscribe(job_public_id)
        except Exception:  # noqa: BLE001  (Redis down: poll the database instead)
            subscription = None
    try:
        snapshot = await _snapshot_async(job_pk)
        if snapshot is None:
            return
        job, stream_seq = snapshot
        follower = _Follower(job_pk)
        follower.last = stream_seq if resume == -1 else (resume or 0)
        yield record(None, STATUS, job).frame()
        follower.finished = job["status"] in TERMINAL_STATUSES
        async for frame in follower.catch_up():
            yield frame
        heartbeat = float(settings.LAB_STREAM_HEARTBEAT_S)
        poll = settings.LAB_STREAM_POLL_MS / 1000
        next_beat = time.monotonic() + heartbeat
        while follower.exists and not follower.finished:
            live = subscription is not None and not subscription.broken
            wait = max(0.0, next_beat - time.monotonic())
            batch: list[StreamRecord] | None = None
            if live:
                try:
                    batch = await asyncio.wait_for(subscription.get(), timeout=wait)
                except TimeoutError:
                    batch = None
            else:
                await asyncio.sleep(min(poll, wait))
            if batch and not subscription.lagged:
                for item in batch:
                    if item.seq is not None and item.seq > follower.last + 1:
                        async for frame in follower.fill_gap(item.seq - 1):
                            yield frame
                    for frame in follower.emit([item]):
                        yield frame
            elif not live or time.monotonic() >= next_beat or (subscription is not None and subscription.lagged):
                if subscription is not None and subscription.lagged:
                    subscription.clear()
                    subscription.lagged = False
                async for frame in follower.catch_up():
                    yield frame
            if time.monotonic() >= next_beat and not follower.finished:
                if grant is not None and not await _allowed_async(grant, job_pk):
                    return  # key revoked, logged out or no longer a member: reconnecting says which
                yield ": keep-alive\n\n"
                next_beat = time.monotonic() + heartbeat
    finally:
        if subscription is not None and hub is not None:
            await hub.unsubscribe(subscription)
