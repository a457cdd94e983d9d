"""Rows read once for a block of work instead of once per row it handles.

A caller that handles many rows in one transaction (the reconciler finishing a batch of jobs)
reads, before the block, what each row's handling would otherwise read on its own; inside the
block (in this thread) those reads are served from it. Only for what nothing in the block
changes: each use says why that holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ReadOnce(Generic[K, V]):
    """Values by key held for the ``holding`` block that is running in this thread."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextmanager
    def holding(self, values: Mapping[K, V]) -> Iterator[None]:
        """Hold ``values`` for the block (with those of an enclosing block)."""
        outer = getattr(self._local, "values", None)
        self._local.values = dict(values) if outer is None else {**outer, **values}
        try:
            yield
        finally:
            self._local.values = outer

    def values(self) -> Mapping[K, V]:
        """Return the values held for the running block (none outside one)."""
        return getattr(self._local, "values", None) or {}
