"""``labsdk.display``: sizes, progress and status order, said one way by the SDK, CLI and pages."""

from __future__ import annotations

import pytest
from labsdk.display import format_bytes, job_progress, progress_line, status_order
from labsdk.types import Checkpoint, Job


@pytest.mark.parametrize(("size", "shown"), [
    (0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1500, "1.5 kB"), (99_949, "99.9 kB"), (99_950, "100 kB"),
    (999_499, "999 kB"), (999_500, "1.0 MB"), (62_634_496, "62.6 MB"), (59_700_000_000, "59.7 GB"),
    (10**15, "1.0 PB"), (5 * 10**18, "5000 PB"), (None, ""),
])
def test_it_shows_sizes_in_decimal_si_units(size, shown):
    assert format_bytes(size) == shown


def test_it_refuses_a_negative_size():
    with pytest.raises(ValueError, match="cannot be negative"):
        format_bytes(-1)


def test_a_checkpoint_repr_shows_its_size_in_the_same_units():
    checkpoint = Checkpoint(id="ckpt_1", step=20, status="ready", size_bytes=62_634_496)

    assert "size='62.6 MB'" in repr(checkpoint)
    assert "size_bytes" not in repr(checkpoint)
    assert checkpoint.size_bytes == 62_634_496


def job(**fields):
    return Job(**{"id": "job_1", "status": "queued", "attempt": 0, "step": 0, "max_steps": 20, **fields})


def test_a_queued_job_shows_its_queue_place_and_reason():
    assert job_progress(job(queue_position=1, status_reason="pool_full")) == {"status": "queued", "queue": "1, pool_full"}
    assert job_progress(job(queue_position=None, status_reason=None)) == {"status": "queued"}


def test_a_starting_or_running_job_shows_the_engine_phase():
    assert job_progress(job(status="starting", attempt=1, phase="loading")) == {"status": "starting", "phase": "loading"}
    assert job_progress(job(status="running", attempt=1)) == {"status": "running"}
    assert job_progress(job(status="succeeded", attempt=1, phase="finishing")) == {"status": "succeeded"}


def test_a_progress_line_says_status_step_and_metrics():
    line = progress_line(job(status="running", attempt=1, step=7, phase="checkpointing"),
                         {"reward/mean": 0.3125, "loss/mean": 0.004123})

    assert line == "job_1 running (phase checkpointing) step 7/20 reward/mean=0.3125 loss/mean=0.004123"


def test_status_snapshots_order_in_time_across_a_requeue():
    timeline = [
        job(),
        job(status="starting", attempt=1),
        job(status="running", attempt=1, step=3),
        job(status="running", attempt=1, step=5),
        job(status="queued", attempt=1, step=5, status_reason="requeued_after_crash"),
        job(status="starting", attempt=2, step=5),
        job(status="succeeded", attempt=2, step=20),
    ]

    assert sorted(timeline, key=status_order) == timeline
    assert status_order(timeline[1]) < status_order(timeline[3])
