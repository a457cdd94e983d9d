"""How the SDK, the CLI, the demo and the dashboard show things to people: sizes, a job's progress
and its main metrics, said one way everywhere.

Sizes are decimal SI units (1 kB = 1,000 bytes, 1 MB = 1,000,000 bytes; the units of the
International System as adopted for bytes by IEC 80000-13), the same base tqdm's byte bars use
(``unit_scale=True``), so a download bar and a listing give the same number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The metrics shown by default (``lab jobs metrics``, ``lab jobs watch`` without a terminal),
#: in this order: prime-rl's names (docs/api.md "Metric names").
MAIN_METRICS = ("reward/mean", "loss/mean", "entropy/mean", "seq_len/mean")

#: What a step's progress line adds when the zero_advantage filter dropped every rollout of its
#: batch (``filter/zero_advantage/fraction`` 1): the step trained on nothing. The engine's step
#: log line says the same (engine/trainer.py).
NO_LEARNING_SIGNAL = "; every group had the same reward: nothing to learn from (filter/zero_advantage/fraction 1)"

_SIZE_UNITS = ("kB", "MB", "GB", "TB", "PB")


def learning_signal_note(values: Mapping[str, float]) -> str:
    """Return :data:`NO_LEARNING_SIGNAL` when a step's metric ``values`` say every group had the
    same reward, else ``""``."""
    return NO_LEARNING_SIGNAL if values.get("filter/zero_advantage/fraction", 0.0) >= 1.0 else ""


def format_bytes(size: int | float | None) -> str:
    """Return ``size`` (bytes) in decimal SI units with three significant figures at most:
    ``999 B``, ``1.5 kB``, ``62.6 MB``; ``""`` for ``None``. Raises ValueError for a negative size."""
    if size is None:
        return ""
    if size < 0:
        raise ValueError(f"a size cannot be negative: {size}")
    if size < 1000:
        return f"{int(size)} B"
    value = float(size)
    for unit in _SIZE_UNITS:
        value /= 1000
        if round(value, 1) < 100:
            return f"{value:.1f} {unit}"
        if round(value) < 1000 or unit == _SIZE_UNITS[-1]:
            return f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def job_progress(job: Any) -> dict[str, str]:
    """Return what a progress line says about ``job`` (a :class:`labsdk.Job`) besides its step:
    ``status``, then for a queued job its ``queue`` place and why it waits (``"1, pool_full"``),
    for a starting or running one the engine's ``phase`` from its latest heartbeat (``loading``,
    ``running``, ``checkpointing``, ``finishing``) when Lab reports it."""
    shown = {"status": job.status or "unknown"}
    if job.status == "queued":
        place = [str(job.queue_position)] if job.queue_position else []
        if job.status_reason:
            place.append(job.status_reason)
        if place:
            shown["queue"] = ", ".join(place)
    elif getattr(job, "phase", None) and job.status in ("starting", "running", "cancelling"):
        shown["phase"] = job.phase
    return shown


def status_order(job: Any) -> tuple[int, int, int]:
    """Return a key that orders status snapshots of one job (:class:`labsdk.Job`) in time.

    A stream opened without ``Last-Event-ID`` starts with the current status, then replays the
    older ones: a display must not go back to them. Within an attempt queued < starting <
    running < cancelling, then by step; a job queued again after attempt N (requeued, its
    ``attempt`` still N) comes after that attempt's snapshots and before attempt N + 1's; a
    finished job after everything."""
    rank = {"queued": 0, "starting": 1, "running": 2, "cancelling": 3}.get(job.status or "", 5)
    if job.status == "queued" and (job.attempt or 0) > 0:
        rank = 4
    return (job.attempt or 0, rank, job.step or 0)


def progress_line(job: Any, metrics: Mapping[str, float] | None = None) -> str:
    """Return one plain line about ``job`` for logs and pipes:
    ``job_... running (phase running) step 7/20 reward/mean=0.312 loss/mean=0.0041``."""
    shown = job_progress(job)
    detail = ", ".join(f"{key} {value}" for key, value in shown.items() if key != "status")
    parts = [job.id, shown["status"] + (f" ({detail})" if detail else "")]
    if job.max_steps is not None:
        parts.append(f"step {job.step or 0}/{job.max_steps}")
    parts += [f"{name}={value:.4g}" for name, value in (metrics or {}).items()]
    return " ".join(parts)
