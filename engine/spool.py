"""The engine's spool: what an attempt has to tell Lab, on disk until Lab acknowledges it.

One directory per attempt (``<workdir>/spool/attempt-<n>/``) holds, per stream (``metrics``,
``samples``, ``logs``, ``checkpoints``), an append-only JSON-lines file ``<name>.jsonl`` and a
cursor ``<name>.sent``: how many of its records Lab has acknowledged, in order. The reporter
writes both while the engine runs; after the engine has exited, Lab itself reads the same files
(``jobs.ingest.spool``) to deliver what the engine could not. Standard library only, so Lab's
server can import it without torch.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading

#: The spool's streams, in the order Lab delivers them after an exit.
STREAMS = ("metrics", "samples", "logs", "checkpoints")


def attempt_spool_dir(workdir: pathlib.Path, attempt: int) -> pathlib.Path:
    """Return the spool directory of ``attempt`` under an engine work directory."""
    return pathlib.Path(workdir) / "spool" / f"attempt-{attempt}"


class Spool:
    """One stream's records on disk: ``<name>.jsonl`` (append-only) and ``<name>.sent`` (acknowledged count).

    ``writable=False`` opens an existing spool only to read it and move its cursor (Lab does
    that after the engine exited); appending is then refused.
    """

    def __init__(self, directory: pathlib.Path, name: str, *, writable: bool = True):
        directory = pathlib.Path(directory)
        if writable:
            directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.jsonl"
        self.cursor_path = directory / f"{name}.sent"
        self.records: list[dict] = []
        if self.path.exists():
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        break  # a torn last line from a crash; everything before it is intact
                    if not isinstance(record, dict):
                        break
                    self.records.append(record)
        try:
            self.sent = max(0, min(len(self.records), int(self.cursor_path.read_text())))
        except (OSError, ValueError):
            self.sent = 0
        self._handle = open(self.path, "a", encoding="utf-8") if writable else None
        self._lock = threading.Lock()

    def append(self, record: dict) -> int:
        """Store one record durably (flushed to the OS) and return its index."""
        if self._handle is None:
            raise RuntimeError(f"{self.path} is open read-only")
        with self._lock:
            self._handle.write(json.dumps(record, allow_nan=False, sort_keys=True) + "\n")
            self._handle.flush()
            self.records.append(record)
            return len(self.records) - 1

    def pending(self, limit: int, max_bytes: int | None = None) -> tuple[int, list[dict]]:
        """Return (index of the first unacknowledged record, up to ``limit`` records from it),
        with ``max_bytes`` only as many as fit in that many bytes of JSON (at least one)."""
        with self._lock:
            start, records = self.sent, self.records[self.sent : self.sent + limit]
        if max_bytes is not None:
            size = 0
            for count, record in enumerate(records):
                size += len(json.dumps(record)) + 1
                if size > max_bytes and count:
                    records = records[:count]
                    break
        return start, records

    def acknowledge(self, count: int) -> None:
        """Mark ``count`` more records as received by Lab, durably (write, then rename)."""
        with self._lock:
            self.sent += count
            # One partial file per writer: Lab and a late engine may both move a cursor.
            partial = self.cursor_path.with_name(f"{self.cursor_path.name}.{os.getpid()}.{threading.get_ident()}.partial")
            partial.write_text(str(self.sent))
            os.replace(partial, self.cursor_path)

    def unsent(self) -> int:
        """Return how many records Lab has not acknowledged yet."""
        with self._lock:
            return len(self.records) - self.sent

    def close(self) -> None:
        """Close the file (a read-only spool has none open)."""
        if self._handle is not None:
            self._handle.close()
