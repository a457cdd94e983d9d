"""Advisory locks: claims on a piece of work that lock no row (PostgreSQL session advisory locks).

A row lock held while a launcher talks to a cluster, or while Lab copies an archive, would stall
every report of that job (they lock the same row). An advisory lock on ``(namespace, key)``
serializes only the work that asks for it. On SQLite, which serializes writers anyway, the claim
is always granted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

#: Namespaces of Lab's advisory locks (the first key); the second key is a row's primary key.
LAUNCH = 0x1AB0002
SPOOL_DELIVERY = 0x1AB0003
ENVIRONMENT_PUSH = 0x1AB0004
SERVING_SERVER = 0x1AB0005
SERVING_WEIGHTS = 0x1AB0006
#: Requests of one project under one idempotency key (the second key hashes the pair).
IDEMPOTENCY = 0x1AB0007


def advisory_xact_lock(namespace: int, key: int) -> None:
    """Take the advisory lock ``(namespace, key)`` until the current transaction ends, waiting
    for it (PostgreSQL's ``pg_advisory_xact_lock``); call it inside ``transaction.atomic``."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [namespace, key])


@contextmanager
def advisory_lock(namespace: int, key: int, *, wait: bool) -> Iterator[bool]:
    """Hold the advisory lock ``(namespace, key)`` for the ``with`` block.

    With ``wait`` it blocks until the lock is free and yields True; without, it yields whether
    the lock was free (False: another session holds it, do not do the work).
    """
    if connection.vendor != "postgresql":
        yield True
        return
    with connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [namespace, key])
            claimed = True
        else:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [namespace, key])
            claimed = cursor.fetchone()[0]
    try:
        yield claimed
    finally:
        if claimed:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [namespace, key])
