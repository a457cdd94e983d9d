"""The reporter: everything the engine tells Lab goes through the ingest API (DESIGN.md §4).

Metrics, samples and log lines are appended to a spool on disk first (one JSON-lines file per
stream and a cursor of what Lab has acknowledged), then sent in batches by a background
thread; training never waits on Lab. When Lab is unreachable or answers 429/5xx, the sender
backs off (capped exponential) and retries the very same batch with the same idempotency
key, so nothing is lost and nothing is sent twice on purpose; Lab's per-step merge makes a
replay harmless anyway. A second thread sends the heartbeat (`POST /status`) and turns
`{"action": "stop"}` into `stop_requested`. Checkpoints are registered, uploaded and
completed by the sender in order. `--offline` swaps the HTTP transport for one that writes
the same bodies under the work directory.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import pathlib
import shutil
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

logger = logging.getLogger("engine.reporter")

MAX_POINTS_PER_BATCH = 1000  # DESIGN.md §4: ingest batches are limited to 1,000 points
MAX_SAMPLES_PER_BATCH = 200
MAX_LINES_PER_BATCH = 500


def utc_now() -> str:
    """Return the current time as an ISO 8601 UTC string (`2026-11-29T22:16:31Z`)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class IngestError(Exception):
    """A call to the ingest API failed; `retryable` when trying again may succeed."""

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code


class Transport(Protocol):
    """How the reporter reaches Lab: JSON POSTs under the job's ingest URL and archive uploads."""

    def post(self, path: str, body: dict, *, idempotency_key: str | None = None) -> dict:
        """POST `body` to `path` (relative to `/api/v1/ingest/jobs/{job_id}`); raise IngestError."""

    def upload(self, upload: dict, archive: pathlib.Path) -> None:
        """Store the archive where the checkpoint registration's `upload` says; raise IngestError."""

    def download_checkpoint(self, checkpoint_id: str, destination: pathlib.Path) -> pathlib.Path:
        """Save the archive of a checkpoint this job may start from to `destination`; raise IngestError."""


class HttpTransport:
    """The ingest API over HTTP with the job token, through labsdk's HTTP layer.

    Retries are the reporter's job (it spools), so the client makes one attempt per call.
    """

    def __init__(self, lab_url: str, job_id: str, token: str, *, timeout: float = 15.0):
        from labsdk._http import HTTPClient

        self.client = HTTPClient(
            base_url=f"{lab_url.rstrip('/')}/api/v1/ingest/jobs/{job_id}",
            token=token,
            timeout=timeout,
            max_retries=0,
            user_agent="lab-engine",
        )
        self.timeout = timeout

    def post(self, path: str, body: dict, *, idempotency_key: str | None = None) -> dict:
        from labsdk.errors import LabError

        try:
            return self.client.request("POST", path, json_body=body, idempotency_key=idempotency_key) or {}
        except LabError as error:
            status = error.status_code
            retryable = status is None or status == 429 or status >= 500
            raise IngestError(f"POST {path}: {error}", retryable=retryable, status_code=status) from error

    def upload(self, upload: dict, archive: pathlib.Path) -> None:
        import httpx

        method = upload.get("method")
        try:
            if method == "local":
                _copy_atomically(archive, pathlib.Path(upload["path"]))
            elif method == "put":
                with open(archive, "rb") as handle:
                    response = httpx.put(
                        upload["url"],
                        content=handle,
                        headers={"Content-Length": str(archive.stat().st_size), **(upload.get("headers") or {})},
                        timeout=max(self.timeout, 300.0),
                        follow_redirects=False,
                    )
                if response.status_code >= 400:
                    raise IngestError(
                        f"checkpoint upload answered {response.status_code}",
                        retryable=response.status_code == 429 or response.status_code >= 500,
                        status_code=response.status_code,
                    )
            else:
                raise IngestError(f"unknown upload method {method!r}", retryable=False)
        except (OSError, httpx.HTTPError) as error:
            raise IngestError(f"checkpoint upload failed: {error}", retryable=True) from error

    def download_checkpoint(self, checkpoint_id: str, destination: pathlib.Path) -> pathlib.Path:
        """GET `checkpoints/{id}/download` with the job token: the tar itself (filesystem
        storage) or, after a redirect, from the signed storage URL without the token."""
        from labsdk.errors import LabError

        try:
            return self.client.download(f"checkpoints/{checkpoint_id}/download", destination)
        except LabError as error:
            status = error.status_code
            retryable = status is None or status == 429 or status >= 500
            raise IngestError(f"checkpoint {checkpoint_id}: {error}", retryable=retryable, status_code=status) from error

    def close(self) -> None:
        self.client.close()


def _copy_atomically(source: pathlib.Path, target: pathlib.Path) -> None:
    if source.resolve() == target.resolve():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


class OfflineTransport:
    """Write what would go to Lab under the work directory (`--offline`).

    `metrics.jsonl` (one point per line, with its attempt), `samples.jsonl`, `logs.jsonl`,
    `checkpoints.jsonl` (completed checkpoints), `status.json` (last heartbeat) and
    `finish.json`; checkpoint archives stay in `checkpoints/`.
    """

    def __init__(self, workdir: pathlib.Path):
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._checkpoints: dict[str, dict] = {}

    def _append(self, name: str, rows: list[dict]) -> None:
        with open(self.workdir / name, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row, sort_keys=True) + "\n")

    def post(self, path: str, body: dict, *, idempotency_key: str | None = None) -> dict:
        attempt = body.get("attempt")
        if path == "metrics":
            self._append("metrics.jsonl", [{**point, "attempt": attempt} for point in body["points"]])
            return {"accepted": len(body["points"]), "duplicates": 0, "superseded": 0}
        if path == "samples":
            self._append("samples.jsonl", [{**sample, "attempt": attempt} for sample in body["samples"]])
            return {"accepted": len(body["samples"])}
        if path == "logs":
            self._append("logs.jsonl", [{**line, "attempt": attempt} for line in body["lines"]])
            return {"accepted": len(body["lines"])}
        if path == "status":
            (self.workdir / "status.json").write_text(json.dumps(body, sort_keys=True))
            return {"action": "continue"}
        if path == "checkpoints":
            checkpoint_id = f"ckpt_offline{body['step']:06d}"
            archive = self.workdir / "checkpoints" / f"step-{body['step']:06d}.tar"
            self._checkpoints[checkpoint_id] = {"id": checkpoint_id, "step": body["step"], "attempt": attempt, "format": body["format"], "path": str(archive)}
            return {"id": checkpoint_id, "upload": {"method": "local", "path": str(archive)}}
        if path.startswith("checkpoints/") and path.endswith("/complete"):
            checkpoint_id = path.split("/")[1]
            self._append("checkpoints.jsonl", [{**self._checkpoints.get(checkpoint_id, {"id": checkpoint_id}), **body, "status": "ready"}])
            return {"id": checkpoint_id, "status": "ready"}
        if path == "finish":
            (self.workdir / "finish.json").write_text(json.dumps(body, sort_keys=True))
            return {}
        raise IngestError(f"offline transport has no {path}", retryable=False)

    def upload(self, upload: dict, archive: pathlib.Path) -> None:
        _copy_atomically(archive, pathlib.Path(upload["path"]))

    def download_checkpoint(self, checkpoint_id: str, destination: pathlib.Path) -> pathlib.Path:
        raise IngestError(
            f"an offline run cannot fetch checkpoint {checkpoint_id} from Lab; pass --init-from a directory or .tar",
            retryable=False,
        )

    def close(self) -> None:
        pass


class Spool:
    """One stream's records on disk: `<name>.jsonl` (append-only) and `<name>.sent` (acknowledged count)."""

    def __init__(self, directory: pathlib.Path, name: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.jsonl"
        self.cursor_path = directory / f"{name}.sent"
        self.records: list[dict] = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    break  # a torn last line from a crash; everything before it is intact
        self.sent = int(self.cursor_path.read_text()) if self.cursor_path.exists() else 0
        self._handle = open(self.path, "a")
        self._lock = threading.Lock()

    def append(self, record: dict) -> int:
        """Store one record durably (flushed to the OS) and return its index."""
        with self._lock:
            self._handle.write(json.dumps(record, allow_nan=False, sort_keys=True) + "\n")
            self._handle.flush()
            self.records.append(record)
            return len(self.records) - 1

    def pending(self, limit: int) -> tuple[int, list[dict]]:
        """Return (index of the first unacknowledged record, up to `limit` records from it)."""
        with self._lock:
            return self.sent, self.records[self.sent : self.sent + limit]

    def acknowledge(self, count: int) -> None:
        """Mark `count` more records as received by Lab, durably."""
        with self._lock:
            self.sent += count
            partial = self.cursor_path.with_name(self.cursor_path.name + ".partial")
            partial.write_text(str(self.sent))
            os.replace(partial, self.cursor_path)

    def unsent(self) -> int:
        with self._lock:
            return len(self.records) - self.sent

    def close(self) -> None:
        self._handle.close()


@dataclass
class _CheckpointUpload:
    step: int
    format: str
    archive: pathlib.Path
    size_bytes: int
    sha256: str
    checkpoint_id: str | None = None
    upload: dict | None = None
    uploaded: bool = False
    on_done: Callable[[str | None], None] | None = None


@dataclass
class _Stream:
    name: str
    body_key: str
    batch_limit: int
    spool: Spool
    inflight: tuple[int, list[dict]] | None = None


@dataclass
class Heartbeat:
    """What the next `POST /status` says."""

    phase: str = "loading"
    step: int = 0
    message: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Reporter:
    """Spool-and-send client of the ingest API for one attempt of one job.

    `stop_requested` is set when Lab answers a heartbeat with `{"action": "stop"}`; the
    trainer treats it like SIGTERM. Call `start()` once, `close()` at the end.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        job_id: str,
        attempt: int,
        spool_dir: pathlib.Path,
        heartbeat_interval: float = 5.0,
        flush_interval: float = 0.5,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ):
        self.transport = transport
        self.job_id = job_id
        self.attempt = attempt
        self.heartbeat_interval = heartbeat_interval
        self.flush_interval = flush_interval
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        spool_dir = pathlib.Path(spool_dir)
        self.streams = [
            _Stream("metrics", "points", MAX_POINTS_PER_BATCH, Spool(spool_dir, "metrics")),
            _Stream("samples", "samples", MAX_SAMPLES_PER_BATCH, Spool(spool_dir, "samples")),
            _Stream("logs", "lines", MAX_LINES_PER_BATCH, Spool(spool_dir, "logs")),
        ]
        self._logs = self.streams[2].spool
        self.checkpoints: deque[_CheckpointUpload] = deque()
        self.heartbeat = Heartbeat()
        self.stop_requested = threading.Event()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures = 0
        self._last_error = ""

    # ---- producer side (called by the trainer; never blocks on Lab) ----

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Queue one step's metric point; non-finite values are left out (JSON has no NaN)."""
        finite = {name: float(v) for name, v in values.items() if v is not None and math.isfinite(float(v))}
        self.streams[0].spool.append({"step": step, "time": utc_now(), "values": finite})
        self._wake.set()

    def samples(self, samples: list[dict]) -> None:
        """Queue rollout samples: dicts with step, group, prompt, completion, reward, advantage, metrics."""
        for sample in samples:
            self.streams[1].spool.append(sample)
        self._wake.set()

    def log(self, line: str, stream: str = "stdout") -> None:
        """Queue one log line; its seq is its index in this attempt's log."""
        self._logs.append({"seq": len(self._logs.records), "time": utc_now(), "stream": stream, "line": line})

    def set_status(self, phase: str, step: int, message: str = "") -> None:
        """Set what the heartbeat reports (phase: loading|running|checkpointing|finishing)."""
        with self.heartbeat.lock:
            self.heartbeat.phase, self.heartbeat.step, self.heartbeat.message = phase, step, message

    def checkpoint(
        self, step: int, format: str, archive: pathlib.Path, size_bytes: int, sha256: str,
        on_done: Callable[[str | None], None] | None = None,
    ) -> None:
        """Queue a checkpoint archive for register → upload → complete (in the background)."""
        self.checkpoints.append(_CheckpointUpload(step, format, pathlib.Path(archive), size_bytes, sha256, on_done=on_done))
        self._wake.set()

    # ---- lifecycle ----

    def start(self) -> None:
        """Start the sender and heartbeat threads (daemons)."""
        for target, name in ((self._send_loop, "lab-sender"), (self._heartbeat_loop, "lab-heartbeat")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def unsent(self) -> int:
        """Records and checkpoints not yet acknowledged by Lab."""
        return sum(s.spool.unsent() for s in self.streams) + len(self.checkpoints)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for everything queued to reach Lab; True if it did."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self.unsent() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.unsent()

    def close(self, outcome: str | None, error: dict | None = None, *, timeout: float = 60.0) -> bool:
        """Flush (up to `timeout` s), send `POST /finish` with `outcome` (unless None), stop threads.

        Returns True when everything, the finish included, reached Lab. What did not stays
        in the spool directory.
        """
        deadline = time.monotonic() + timeout
        self.set_status("finishing", self.heartbeat.step)
        delivered = self.flush(timeout)
        finished = outcome is None
        if outcome is not None:
            body = {"attempt": self.attempt, "outcome": outcome}
            if error:
                body["error"] = error
            delay = self.backoff_base
            while not finished:
                try:
                    self.transport.post("finish", body, idempotency_key=f"{self.job_id}:{self.attempt}:finish")
                    finished = True
                except IngestError as exc:
                    self._note_failure(exc)
                    if not exc.retryable or time.monotonic() + delay > deadline:
                        break
                    time.sleep(delay)
                    delay = min(self.backoff_cap, delay * 2)
        self._closing.set()
        self._stopped.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for stream in self.streams:
            stream.spool.close()
        close = getattr(self.transport, "close", None)
        if close:
            close()
        return delivered and finished

    # ---- background threads ----

    def _note_failure(self, error: IngestError) -> None:
        self._failures += 1
        message = str(error)
        if message != self._last_error:
            self._last_error = message
            print(f"engine: Lab ingest: {message}", file=sys.stderr, flush=True)

    def _send_stream(self, stream: _Stream) -> bool:
        """Send one batch of a stream; return True if something was acknowledged."""
        if stream.inflight is None:
            start, records = stream.spool.pending(stream.batch_limit)
            if not records:
                return False
            stream.inflight = (start, records)
        start, records = stream.inflight
        body = {"attempt": self.attempt, stream.body_key: records}
        key = f"{self.job_id}:{self.attempt}:{stream.name}:{start}:{len(records)}"
        try:
            self.transport.post(stream.name, body, idempotency_key=key)
        except IngestError as error:
            if error.retryable:
                raise
            # Lab refused this batch for good (4xx): retrying cannot help; drop it, keep going.
            self._note_failure(error)
        stream.spool.acknowledge(len(records))
        stream.inflight = None
        return True

    def _send_checkpoint(self, item: _CheckpointUpload) -> None:
        key = f"{self.job_id}:{self.attempt}:checkpoint:{item.step}"
        if item.checkpoint_id is None:
            answer = self.transport.post(
                "checkpoints", {"attempt": self.attempt, "step": item.step, "format": item.format},
                idempotency_key=key,
            )
            item.checkpoint_id, item.upload = answer["id"], answer["upload"]
        if not item.uploaded:
            self.transport.upload(item.upload, item.archive)
            item.uploaded = True
        self.transport.post(
            f"checkpoints/{item.checkpoint_id}/complete",
            {"size_bytes": item.size_bytes, "sha256": item.sha256},
            idempotency_key=key + ":complete",
        )

    def _send_loop(self) -> None:
        delay = self.backoff_base
        while not self._stopped.is_set():
            try:
                progressed = False
                for stream in self.streams:
                    progressed |= self._send_stream(stream)
                if self.checkpoints:
                    item = self.checkpoints[0]
                    try:
                        self._send_checkpoint(item)
                        done_id = item.checkpoint_id
                    except IngestError as error:
                        if error.retryable:
                            raise
                        self._note_failure(error)
                        done_id = None
                    self.checkpoints.popleft()
                    if item.on_done:
                        item.on_done(done_id)
                    progressed = True
                delay = self.backoff_base
                if not progressed:
                    self._wake.wait(self.flush_interval)
                    self._wake.clear()
            except IngestError as error:
                self._note_failure(error)
                self._wake.wait(delay)  # close() wakes us early to flush
                self._wake.clear()
                delay = min(self.backoff_cap, delay * 2)
            except Exception as error:  # a bug here must not kill training; report and retry
                self._note_failure(IngestError(f"reporter error: {error!r}", retryable=True))
                self._wake.wait(delay)
                delay = min(self.backoff_cap, delay * 2)

    def _heartbeat_loop(self) -> None:
        while not self._closing.is_set():
            with self.heartbeat.lock:
                body = {"attempt": self.attempt, "phase": self.heartbeat.phase, "step": self.heartbeat.step, "message": self.heartbeat.message}
            try:
                answer = self.transport.post("status", body)
                if isinstance(answer, dict) and answer.get("action") == "stop":
                    self.stop_requested.set()
            except IngestError as error:
                self._note_failure(error)
            except Exception as error:
                self._note_failure(IngestError(f"heartbeat error: {error!r}", retryable=True))
            self._closing.wait(self.heartbeat_interval)


class ReporterLogHandler(logging.Handler):
    """Forward the engine's log records to the reporter as log lines (stderr for warnings and up)."""

    def __init__(self, reporter: Reporter):
        super().__init__(level=logging.INFO)
        self.reporter = reporter

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = "stderr" if record.levelno >= logging.WARNING else "stdout"
            for line in self.format(record).splitlines() or [""]:
                self.reporter.log(line, stream)
        except Exception:
            self.handleError(record)
