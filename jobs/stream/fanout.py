"""Live fan-out of stream records over Redis pub/sub (docs/architecture.md "Parts and how each runs").

Writers publish each committed batch of records on the job's channel (:func:`publish_on_commit`).
In each server process one :class:`StreamHub` holds one Redis connection subscribed to the
channels its clients follow and hands every message to each of them, so 200 clients of one job
cost one subscription, and each record is decoded once. Without ``REDIS_URL`` (the embedded
default) nothing is published and clients poll the database instead.

A client whose queue overflows, or whose hub lost Redis, is told so (``lagged``/``broken``) and
catches up from the database: records are numbered, so nothing is lost or sent twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Sequence
from functools import cache

import redis
import redis.asyncio
from django.conf import settings
from django.db import transaction

from jobs.stream.records import StreamRecord

logger = logging.getLogger(__name__)

#: Seconds the hub waits for Redis to take a subscription before its clients poll instead, and
#: seconds it then leaves Redis alone.
REDIS_TIMEOUT_S = 2.0
RETRY_AFTER_S = 5.0
#: Messages a client may have waiting before it is switched to catching up from the database.
QUEUE_LIMIT = 1000
#: Bytes of record data a client may have waiting, likewise: a message can be a megabyte (a
#: batch of 1,000 samples), so a message count alone would let one client that does not read
#: hold a gigabyte of the server's memory.
QUEUE_BYTES_LIMIT = 8 * 1024 * 1024


def channel_name(job_public_id: str) -> str:
    """Return the Redis channel of a job's records."""
    return f"lab:stream:{job_public_id}"


@cache
def _publisher(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def publish(job_public_id: str, records: Sequence[StreamRecord]) -> None:
    """Publish ``records`` (committed, in number order) on the job's channel; no-op without Redis.

    A Redis failure is logged, not raised: clients find the records in the database at their
    next catch-up (on the next record's gap, or at the latest at the next heartbeat).
    """
    if not records or not settings.REDIS_URL:
        return
    payload = json.dumps([item.as_list() for item in records], separators=(",", ":"))
    try:
        _publisher(settings.REDIS_URL).publish(channel_name(job_public_id), payload)
    except redis.RedisError as exc:
        logger.warning("stream publish to Redis failed; clients will catch up from the database: %s", exc)


def publish_on_commit(job_public_id: str, records: Sequence[StreamRecord]) -> None:
    """Publish ``records`` once the current transaction commits (never for a rolled-back one)."""
    if records and settings.REDIS_URL:
        records = list(records)
        transaction.on_commit(lambda: publish(job_public_id, records))


class Subscription:
    """One client's view of a channel: a bounded queue of record batches.

    ``lagged`` is set when a batch could not be queued (more than ``QUEUE_LIMIT`` batches or
    ``QUEUE_BYTES_LIMIT`` bytes waiting: the client must catch up from the database); ``broken``
    when the hub lost Redis (the client must poll from now on).
    """

    def __init__(self, channel: str):
        self.channel = channel
        self.queue: asyncio.Queue[tuple[list[StreamRecord], int] | None] = asyncio.Queue(maxsize=QUEUE_LIMIT)
        self.queued_bytes = 0
        self.lagged = False
        self.broken = False

    def deliver(self, records: list[StreamRecord], size: int = 0) -> None:
        """Queue a batch of ``size`` bytes, or mark the client lagged (and drop what waits: the
        client reads all of it again from the database)."""
        if self.lagged:
            return
        if self.queued_bytes + size > QUEUE_BYTES_LIMIT or self.queue.full():
            self.lagged = True
            self.clear()
            self.queue.put_nowait(([], 0))  # wake the client now, to catch up
            return
        self.queue.put_nowait((records, size))
        self.queued_bytes += size

    async def get(self) -> list[StreamRecord] | None:
        """Wait for the next batch (``None`` when the hub lost Redis)."""
        item = await self.queue.get()
        if item is None:
            return None
        records, size = item
        self.queued_bytes -= size
        return records

    def clear(self) -> None:
        """Drop every waiting batch (a lagged client catches up from the database instead)."""
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is None:  # keep the hub's wake-up: the client must learn it lost Redis
                self.queue.put_nowait(None)
                break
        self.queued_bytes = 0

    def interrupt(self) -> None:
        self.broken = True
        try:
            self.queue.put_nowait(None)  # wake the client now
        except asyncio.QueueFull:
            pass


class StreamHub:
    """The per-process, per-event-loop owner of the Redis subscription (see module doc)."""

    def __init__(self, url: str):
        self._url = url
        self._client: redis.asyncio.Redis | None = None
        self._pubsub = None
        self._channels: dict[str, set[Subscription]] = {}
        self._reader: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._retry_at = 0.0

    @property
    def channel_count(self) -> int:
        """How many channels this process is subscribed to (for tests and metrics)."""
        return len(self._channels)

    async def subscribe(self, job_public_id: str) -> Subscription:
        """Follow a job's channel. Raises ``redis.RedisError`` when Redis cannot be reached.

        A Redis that does not answer within ``REDIS_TIMEOUT_S`` (stopped, or a dead network path
        that still accepts connections) counts as unreachable, and for ``RETRY_AFTER_S`` after
        that every subscribe fails at once: clients poll the database instead of queueing up
        behind one another on the hub's lock.
        """
        subscription = Subscription(channel_name(job_public_id))
        async with self._lock:
            if time.monotonic() < self._retry_at:
                raise redis.ConnectionError("Redis was unreachable moments ago")
            if self._pubsub is None:
                self._client = redis.asyncio.Redis.from_url(self._url, socket_connect_timeout=REDIS_TIMEOUT_S)
                self._pubsub = self._client.pubsub()
            listeners = self._channels.setdefault(subscription.channel, set())
            if not listeners:
                try:
                    await asyncio.wait_for(self._pubsub.subscribe(subscription.channel), REDIS_TIMEOUT_S)
                except (redis.RedisError, OSError, TimeoutError) as exc:
                    del self._channels[subscription.channel]
                    self._retry_at = time.monotonic() + RETRY_AFTER_S
                    closing = self._detach()
                    await _close(closing)
                    raise redis.ConnectionError(f"Redis did not take the subscription: {exc!r}") from exc
            listeners.add(subscription)
            if self._reader is None:
                self._reader = asyncio.create_task(self._read(), name="lab-stream-hub")
        return subscription

    async def unsubscribe(self, subscription: Subscription) -> None:
        """Stop following; the channel is left when its last client goes."""
        async with self._lock:
            listeners = self._channels.get(subscription.channel)
            if listeners is None or subscription not in listeners:
                return
            listeners.discard(subscription)
            if not listeners:
                del self._channels[subscription.channel]
                try:
                    await asyncio.wait_for(self._pubsub.unsubscribe(subscription.channel), REDIS_TIMEOUT_S)
                except (redis.RedisError, OSError, TimeoutError) as exc:
                    logger.warning("stream unsubscribe failed: %r", exc)

    async def _read(self) -> None:
        """Hand each message to the channel's clients while any channel is followed."""
        me = asyncio.current_task()
        while True:
            async with self._lock:
                if self._reader is not me:  # the hub dropped Redis and may have started afresh
                    return
                if not self._channels:
                    self._reader = None
                    return
                pubsub = self._pubsub
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (redis.RedisError, OSError, RuntimeError) as exc:
                await self._fail(exc, pubsub)
                return
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"].decode() if isinstance(message["channel"], bytes) else message["channel"]
            listeners = self._channels.get(channel)
            if not listeners:
                continue
            try:
                records = [StreamRecord(*item) for item in json.loads(message["data"])]
            except (ValueError, TypeError) as exc:
                logger.warning("ignoring a malformed stream message on %s: %s", channel, exc)
                continue
            size = len(message["data"])
            for subscription in list(listeners):
                subscription.deliver(records, size)

    async def _fail(self, exc: BaseException, pubsub) -> None:
        """Redis is gone: tell every client to poll the database, and start afresh next time."""
        logger.warning("stream hub lost Redis; clients fall back to polling: %s", exc)
        async with self._lock:
            if self._pubsub is not pubsub:  # already dropped (and perhaps replaced)
                return
            closing = self._detach()
        await _close(closing)

    def _detach(self) -> tuple:
        """Drop the Redis connection (the lock held): every client is told to poll from now on.
        Returns what the caller must close."""
        for listeners in self._channels.values():
            for subscription in listeners:
                subscription.interrupt()
        self._channels.clear()
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        closing = (self._pubsub, self._client)
        self._pubsub = self._client = None
        return closing


async def _close(closing: tuple) -> None:
    for item in closing:
        if item is None:
            continue
        try:
            await asyncio.wait_for(item.aclose(), REDIS_TIMEOUT_S)
        except (redis.RedisError, OSError, TimeoutError):
            pass


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StreamHub] = weakref.WeakKeyDictionary()


def get_hub() -> StreamHub | None:
    """Return this event loop's hub, or ``None`` without ``REDIS_URL`` (poll the database)."""
    if not settings.REDIS_URL:
        return None
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = StreamHub(settings.REDIS_URL)
    return hub
