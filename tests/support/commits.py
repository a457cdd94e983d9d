"""Run ``transaction.on_commit`` callbacks in tests that run inside a rolled-back transaction.

A plain ``django_db`` test runs inside atomic blocks that pytest-django opens for the test case and
rolls back at its end, so the code's own transactions are savepoints and their on-commit callbacks
(tasks sent through ``lab.dispatch``, stream publishes, storage deletes, webhook deliveries) never
run. :func:`run_on_commit_callbacks` makes the test-case blocks invisible to them: a callback
registered while only test-case blocks are open runs at once (as under autocommit), and the
callbacks registered inside the code's own outermost block run when that block exits, as its
commit would run them. A block that rolls back drops its callbacks first (Django does this for
savepoints), so a rolled-back transaction sends nothing. Used by the ``commit_callbacks`` fixture in
tests/conftest.py; tests that need real commits seen by other connections keep
``django_db(transaction=True)`` (tests/test_suite.py lists them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)


def _outside_code_transactions(connection: BaseDatabaseWrapper) -> bool:
    """True when every open atomic block on ``connection`` is one the test case opened."""
    return all(block._from_testcase for block in connection.atomic_blocks)


def _run_pending(connection: BaseDatabaseWrapper) -> None:
    """Run and clear the callbacks waiting on ``connection``, in registration order, as
    ``run_and_clear_commit_hooks`` does at a real commit (a robust callback's error is logged, any
    other propagates)."""
    while connection.run_on_commit and not connection.needs_rollback:
        _, func, robust = connection.run_on_commit.pop(0)
        if not robust:
            func()
            continue
        try:
            func()
        except Exception:
            logger.exception("Error calling %s in on_commit()", func.__qualname__)


@contextmanager
def run_on_commit_callbacks() -> Iterator[None]:
    """Within the block, run on-commit callbacks when the code's transaction would commit (see the
    module docstring), on every database alias."""
    original_on_commit = BaseDatabaseWrapper.on_commit
    original_exit = transaction.Atomic.__exit__

    def on_commit(connection: BaseDatabaseWrapper, func, robust: bool = False) -> None:
        original_on_commit(connection, func, robust)
        if connection.in_atomic_block and _outside_code_transactions(connection):
            _run_pending(connection)

    def exit_(atomic: transaction.Atomic, exc_type, exc_value, traceback):
        result = original_exit(atomic, exc_type, exc_value, traceback)
        connection = transaction.get_connection(atomic.using or DEFAULT_DB_ALIAS)
        if not atomic._from_testcase and connection.in_atomic_block and _outside_code_transactions(connection):
            _run_pending(connection)
        return result

    BaseDatabaseWrapper.on_commit = on_commit
    transaction.Atomic.__exit__ = exit_
    try:
        yield
    finally:
        BaseDatabaseWrapper.on_commit = original_on_commit
        transaction.Atomic.__exit__ = original_exit
