"""The reporter: everything the engine tells Lab goes through the ingest API (docs/ingest-api.md).

Metrics, samples, log lines, checkpoints and adapter artifacts are appended to a spool on disk
first (`engine.spool`: one JSON-lines file per stream and a cursor of what Lab has acknowledged),
then sent by one background thread per stream; training never waits on Lab, and a stream
that cannot get through never holds up another. When Lab is unreachable or answers 429/5xx,
a sender backs off (capped exponential) and retries the very same batch with the same
idempotency key, so nothing is lost and nothing is sent twice on purpose; Lab's per-step
merge makes a replay harmless anyway. A refusal for good (4xx) or a checkpoint archive that
is gone is never retried. Another thread sends the heartbeat (`POST /status`) and turns
`{"action": "stop"}` into `stop_requested`. Checkpoints are registered, uploaded and
completed in order, and so are adapters (`[adapters]`: the weights alone), in a lane of their
own. What is still unsent when the engine exits stays in the spool, and Lab delivers it from
there (`jobs.ingest.spool`). `--offline` swaps the HTTP transport for one that writes the same
bodies under the work directory.
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
from dataclasses import dataclass, field
from typing import Callable, Protocol

from engine.spool import Spool

logger = logging.getLogger("engine.reporter")

MAX_POINTS_PER_BATCH = 1000  # docs/ingest-api.md: ingest batches are limited to 1,000 points
MAX_SAMPLES_PER_BATCH = 200
MAX_LINES_PER_BATCH = 500
#: The JSON bytes of one batch's records: half of Lab's 1 MB request limit (docs/api.md).
MAX_BATCH_BYTES = 512 * 1024


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


def require_archive(archive: pathlib.Path) -> None:
    """Raise a non-retryable IngestError when the archive to upload is gone: no retry brings it back."""
    if not pathlib.Path(archive).is_file():
        raise IngestError(f"checkpoint archive {archive} no longer exists", retryable=False)


def copy_atomically(source: pathlib.Path, target: pathlib.Path) -> None:
    if source.resolve() == target.resolve():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


class OfflineTransport:
    """Write what would go to Lab under the work directory (`--offline`).

    `metrics.jsonl` (one point per line, with its attempt), `samples.jsonl`, `evaluation-samples.jsonl`, `logs.jsonl`,
    `checkpoints.jsonl` (completed checkpoints), `adapters.jsonl` (completed adapters),
    `status.json` (last heartbeat) and `finish.json`; checkpoint archives stay in `checkpoints/`,
    adapter archives are copied into `adapter-archives/`.
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
        if path == "evaluation-samples":
            self._append("evaluation-samples.jsonl", [{**sample, "attempt": attempt} for sample in body["samples"]])
            return {"accepted": len(body["samples"]), "duplicates": 0}
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
        if path == "adapters":
            adapter_id = f"adp_offline{body['step']:06d}"
            # Not the trainer's own adapters/, which it prunes once Lab (here: this transport) has an archive.
            archive = self.workdir / "adapter-archives" / f"step-{body['step']:06d}.tar"
            self._checkpoints[adapter_id] = {"id": adapter_id, "step": body["step"], "attempt": attempt, "format": body["format"], "path": str(archive)}
            return {"id": adapter_id, "upload": {"method": "local", "path": str(archive)}}
        if path.startswith("adapters/") and path.endswith("/complete"):
            adapter_id = path.split("/")[1]
            self._append("adapters.jsonl", [{**self._checkpoints.get(adapter_id, {"id": adapter_id}), **body, "status": "ready"}])
            return {"id": adapter_id, "status": "ready"}
        if path == "finish":
            (self.workdir / "finish.json").write_text(json.dumps(body, sort_keys=True))
            return {}
        raise IngestError(f"offline transport has no {path}", retryable=False)

    def upload(self, upload: dict, archive: pathlib.Path) -> None:
        require_archive(archive)
        copy_atomically(archive, pathlib.Path(upload["path"]))

    def download_checkpoint(self, checkpoint_id: str, destination: pathlib.Path) -> pathlib.Path:
        raise IngestError(
            f"an offline run cannot fetch checkpoint {checkpoint_id} from Lab; pass --init-from a directory or .tar",
            retryable=False,
        )

    def close(self) -> None:
        pass


@dataclass
class _Lane:
    """One stream of reports with its own sender thread and backoff, so a stream Lab keeps
    refusing (or an upload that keeps failing) never holds up the others."""

    name: str
    body_key: str  # the batch's key in the POST body; "" for checkpoints and adapters (one item at a time)
    batch_limit: int
    spool: Spool
    wake: threading.Event = field(default_factory=threading.Event)
    inflight: tuple[int, list[dict]] | None = None


@dataclass
class _CheckpointProgress:
    """How far the archive (checkpoint or adapter) at the head of its lane got: registered (id,
    upload target), uploaded."""

    index: int
    checkpoint_id: str | None = None
    upload: dict | None = None
    uploaded: bool = False


@dataclass
class Heartbeat:
    """What the next `POST /status` says."""

    phase: str = "loading"
    step: int = 0
    message: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class Reporter:
    """Spool-and-send client of the ingest API for one attempt of one job.

    Six lanes (metrics, samples, logs, checkpoints, adapters, an evaluation's samples), each spooled under `spool_dir` and sent
    by its own thread with its own capped exponential backoff; a heartbeat thread beside them.
    A report Lab refuses for good (4xx) is dropped and counted in `dropped`, never retried; a
    checkpoint whose archive is gone is completed anyway, so Lab marks it `failed` and the lane
    moves on. `stop_requested` is set when Lab answers a heartbeat with `{"action": "stop"}`;
    the trainer treats it like SIGTERM. Call `start()` once, `close()` at the end; what is
    still unsent then stays in the spool, where Lab picks it up after the engine exited.
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
        self._metrics = _Lane("metrics", "points", MAX_POINTS_PER_BATCH, Spool(spool_dir, "metrics"))
        self._samples = _Lane("samples", "samples", MAX_SAMPLES_PER_BATCH, Spool(spool_dir, "samples"))
        self._logs = _Lane("logs", "lines", MAX_LINES_PER_BATCH, Spool(spool_dir, "logs"))
        self._checkpoints = _Lane("checkpoints", "", 1, Spool(spool_dir, "checkpoints"))
        self._adapters = _Lane("adapters", "", 1, Spool(spool_dir, "adapters"))
        self._evaluation_samples = _Lane(
            "evaluation-samples", "samples", MAX_SAMPLES_PER_BATCH, Spool(spool_dir, "evaluation-samples")
        )
        self.lanes = (self._metrics, self._samples, self._logs, self._checkpoints, self._adapters, self._evaluation_samples)
        self._archive_progress: dict[str, _CheckpointProgress | None] = {"checkpoints": None, "adapters": None}
        self._checkpoint_callbacks: dict[int, Callable[[str | None], None]] = {}
        self.heartbeat = Heartbeat()
        self.stop_requested = threading.Event()
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failure_lock = threading.Lock()
        self._failures = 0
        self._last_error = ""
        #: Reports Lab refused for good, per lane (records, or checkpoints).
        self.dropped: dict[str, int] = {lane.name: 0 for lane in self.lanes}

    # ---- producer side (called by the trainer; never blocks on Lab) ----

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Queue one step's metric point; non-finite values are left out (JSON has no NaN)."""
        finite = {name: float(v) for name, v in values.items() if v is not None and math.isfinite(float(v))}
        self._metrics.spool.append({"step": step, "time": utc_now(), "values": finite})
        self._metrics.wake.set()

    def samples(self, samples: list[dict]) -> None:
        """Queue rollout samples: dicts with step, group, prompt, completion, reward, advantage, metrics."""
        for sample in samples:
            self._samples.spool.append(sample)
        self._samples.wake.set()

    def evaluation_samples(self, samples: list[dict]) -> None:
        """Queue an evaluation's scored samples (engine/evaluation.py; fields as docs/ingest-api.md
        says). Lab stores each (environment, example, rollout) once: a resent batch is harmless."""
        for sample in samples:
            self._evaluation_samples.spool.append(sample)
        self._evaluation_samples.wake.set()

    def log(self, line: str, stream: str = "stdout") -> None:
        """Queue one log line; its seq is its index in this attempt's log."""
        spool = self._logs.spool
        spool.append({"seq": len(spool.records), "time": utc_now(), "stream": stream, "line": line})

    def set_status(self, phase: str, step: int, message: str = "") -> None:
        """Set what the heartbeat reports (phase: loading|running|checkpointing|finishing)."""
        with self.heartbeat.lock:
            self.heartbeat.phase, self.heartbeat.step, self.heartbeat.message = phase, step, message

    def checkpoint(
        self, step: int, format: str, archive: pathlib.Path, size_bytes: int, sha256: str,
        on_done: Callable[[str | None], None] | None = None,
    ) -> None:
        """Queue a checkpoint archive for register → upload → complete (in the background).

        `on_done` is called with the checkpoint's id once Lab has it (ready or failed), or None
        when Lab refused it; the archive must stay where it is until then (`pending_archives`).
        """
        index = self._checkpoints.spool.append(
            {"step": step, "format": format, "archive": str(archive), "size_bytes": size_bytes, "sha256": sha256}
        )
        if on_done is not None:
            self._checkpoint_callbacks[index] = on_done
        self._checkpoints.wake.set()

    def adapter(self, step: int, format: str, archive: pathlib.Path, size_bytes: int, sha256: str) -> None:
        """Queue an adapter archive (`[adapters]`) for register → upload → complete in the background,
        in its own lane (`POST adapters`, `POST adapters/{id}/complete`); keep the archive until
        it is settled (`pending_archives(adapters=True)`)."""
        self._adapters.spool.append(
            {"step": step, "format": format, "archive": str(archive), "size_bytes": size_bytes, "sha256": sha256}
        )
        self._adapters.wake.set()

    def pending_archives(self, *, adapters: bool = False) -> set[pathlib.Path]:
        """Return the archives of checkpoints (or, with `adapters`, of adapters) Lab has not
        settled yet: they must not be deleted."""
        start, records = (self._adapters if adapters else self._checkpoints).spool.pending(1 << 30)
        return {pathlib.Path(record["archive"]) for record in records}

    # ---- lifecycle ----

    def start(self) -> None:
        """Start the lanes' sender threads and the heartbeat thread (daemons)."""
        for lane in self.lanes:
            thread = threading.Thread(target=self._lane_loop, args=(lane,), name=f"lab-{lane.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        thread = threading.Thread(target=self._heartbeat_loop, name="lab-heartbeat", daemon=True)
        thread.start()
        self._threads.append(thread)

    def unsent(self) -> int:
        """Records and checkpoints not yet acknowledged by Lab."""
        return sum(lane.spool.unsent() for lane in self.lanes)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for everything queued to reach Lab; True if it did."""
        deadline = time.monotonic() + timeout
        for lane in self.lanes:
            lane.wake.set()
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
        for lane in self.lanes:
            lane.wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for lane in self.lanes:
            lane.spool.close()
        close = getattr(self.transport, "close", None)
        if close:
            close()
        return delivered and finished

    # ---- background threads ----

    def _note_failure(self, error: IngestError) -> None:
        with self._failure_lock:
            self._failures += 1
            message = str(error)
            if message == self._last_error:
                return
            self._last_error = message
        print(f"engine: Lab ingest: {message}", file=sys.stderr, flush=True)

    def _send_batch(self, lane: _Lane) -> bool:
        """Send one batch of a lane; return True if something was settled."""
        if lane.inflight is None:
            start, records = lane.spool.pending(lane.batch_limit, MAX_BATCH_BYTES)
            if not records:
                return False
            lane.inflight = (start, records)
        start, records = lane.inflight
        body = {"attempt": self.attempt, lane.body_key: records}
        key = f"{self.job_id}:{self.attempt}:{lane.name}:{start}:{len(records)}"
        try:
            self.transport.post(lane.name, body, idempotency_key=key)
        except IngestError as error:
            if error.retryable:
                raise
            # Lab refused this batch for good (4xx): retrying cannot help; drop it, keep going.
            self._note_failure(error)
            self.dropped[lane.name] += len(records)
        lane.spool.acknowledge(len(records))
        lane.inflight = None
        return True

    def _send_checkpoint(self, lane: _Lane | None = None) -> bool:
        """Register, upload and complete the archive at the head of `lane` (checkpoints by
        default, or adapters: the routes are the lane's name); True when settled."""
        lane = lane or self._checkpoints
        index, records = lane.spool.pending(1)
        if not records:
            return False
        record = records[0]
        progress = self._archive_progress[lane.name]
        if progress is None or progress.index != index:
            progress = self._archive_progress[lane.name] = _CheckpointProgress(index)
        step = int(record["step"])
        key = f"{self.job_id}:{self.attempt}:{lane.name.removesuffix('s')}:{step}"
        settled_id: str | None = None
        try:
            if progress.checkpoint_id is None:
                answer = self.transport.post(
                    lane.name, {"attempt": self.attempt, "step": step, "format": record["format"]},
                    idempotency_key=key,
                )
                progress.checkpoint_id, progress.upload = answer["id"], answer["upload"]
            if not progress.uploaded:
                try:
                    self.transport.upload(progress.upload, pathlib.Path(record["archive"]))
                except IngestError as error:
                    if error.retryable:
                        raise
                    # Completing anyway lets Lab find nothing stored and fail the checkpoint.
                    self._note_failure(error)
                progress.uploaded = True
            self.transport.post(
                f"{lane.name}/{progress.checkpoint_id}/complete",
                {"size_bytes": record["size_bytes"], "sha256": record["sha256"]},
                idempotency_key=key + ":complete",
            )
            settled_id = progress.checkpoint_id
        except IngestError as error:
            if error.retryable:
                raise
            self._note_failure(error)
            self.dropped[lane.name] += 1
        lane.spool.acknowledge(1)
        self._archive_progress[lane.name] = None
        callback = self._checkpoint_callbacks.pop(index, None) if lane is self._checkpoints else None
        if callback is not None:
            callback(settled_id)
        return True

    def _lane_loop(self, lane: _Lane) -> None:
        send = (lambda: self._send_checkpoint(lane)) if not lane.body_key else (lambda: self._send_batch(lane))
        delay = self.backoff_base
        while not self._stopped.is_set():
            try:
                progressed = send()
                delay = self.backoff_base
                if not progressed:
                    lane.wake.wait(self.flush_interval)
                    lane.wake.clear()
            except Exception as error:  # a bug here must not kill training; report and retry
                if not isinstance(error, IngestError):
                    error = IngestError(f"reporter error ({lane.name}): {error!r}", retryable=True)
                self._note_failure(error)
                lane.wake.wait(delay)  # close() wakes us early to flush
                lane.wake.clear()
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
