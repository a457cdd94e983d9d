"""``lab jobs watch`` and ``lab jobs metrics`` output, against the fake Lab on a real socket."""

from __future__ import annotations

import json

from labsdk.cli import main


def run(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _status(job, **fields):
    return {**job, **fields}


def test_watch_without_a_terminal_prints_plain_lines_that_never_go_back(lab_env, capsys):
    job = lab_env.add_job(status="running", attempt=1, step=5, phase="running", status_reason=None, queue_position=None)
    lab_env.streams[job["id"]] = [  # replayed history, older than the opening snapshot
        {"id": 1, "event": "status", "data": _status(job, status="queued", attempt=0, step=0, phase=None)},
        {"id": 2, "event": "status", "data": _status(job, status="starting", step=0, phase=None)},
        {"id": 3, "event": "metrics", "data": {"step": 6, "values": {"reward/mean": 0.25, "loss/mean": 0.5, "optim/lr": 1e-4}}},
        {"id": 4, "event": "metrics", "data": {"step": 7, "values": {"reward/mean": 0.5, "entropy/mean": 1.5}}},
        {"id": 5, "event": "status", "data": _status(job, status="succeeded", step=20, phase=None)},
    ]

    status, out, err = run(capsys, "jobs", "watch", job["id"])

    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"{job['id']} running (phase running) step 5/20",
        f"{job['id']} running (phase running) step 6/20 reward/mean=0.25 loss/mean=0.5",
        f"{job['id']} running (phase running) step 7/20 reward/mean=0.5 entropy/mean=1.5",
        f"{job['id']} succeeded step 20/20",
    ]


def test_watch_of_a_finished_job_labels_each_replayed_step_with_its_own_step(lab_env, capsys):
    job = lab_env.add_job(status="succeeded", step=3, phase=None, status_reason=None, queue_position=None, max_steps=3)
    lab_env.streams[job["id"]] = [  # the opening snapshot is the finished job; its steps replay after it
        {"id": step, "event": "metrics", "data": {"step": step, "values": {"reward/mean": step / 4}}} for step in (1, 2, 3)
    ]

    status, out, err = run(capsys, "jobs", "watch", job["id"])

    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"{job['id']} succeeded step 3/3",
        f"{job['id']} succeeded step 1/3 reward/mean=0.25",
        f"{job['id']} succeeded step 2/3 reward/mean=0.5",
        f"{job['id']} succeeded step 3/3 reward/mean=0.75",
    ]


def test_watch_says_when_a_step_had_nothing_to_learn_from(lab_env, capsys):
    job = lab_env.add_job(status="succeeded", step=2, phase=None, status_reason=None, queue_position=None, max_steps=2)
    lab_env.streams[job["id"]] = [
        {"id": 1, "event": "metrics", "data": {"step": 1, "values": {"reward/mean": 0.0, "filter/zero_advantage/fraction": 1.0}}},
        {"id": 2, "event": "metrics", "data": {"step": 2, "values": {"reward/mean": 0.5, "filter/zero_advantage/fraction": 0.5}}},
    ]

    status, out, err = run(capsys, "jobs", "watch", job["id"])

    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"{job['id']} succeeded step 2/2",
        (f"{job['id']} succeeded step 1/2 reward/mean=0"
         "; every group had the same reward: nothing to learn from (filter/zero_advantage/fraction 1)"),
        f"{job['id']} succeeded step 2/2 reward/mean=0.5",
    ]


def test_watch_of_a_failed_job_prints_its_error(lab_env, capsys):
    error = {"code": "engine_error", "message": "ValueError: no example fits max_tokens"}
    job = lab_env.add_job(status="running", step=0, phase="running", status_reason=None, queue_position=None, max_steps=3)
    lab_env.streams[job["id"]] = [
        {"id": 1, "event": "status", "data": _status(job, status="failed", step=0, phase=None, error=error)},
    ]

    status, out, err = run(capsys, "jobs", "watch", job["id"])

    assert status == 1
    assert out.splitlines()[-1] == f"{job['id']} failed step 0/3"
    assert err == f"error: job {job['id']} failed (engine_error: ValueError: no example fits max_tokens)\n"


def test_watch_json_prints_one_line_per_record(lab_env, capsys):
    job = lab_env.add_job(status="running", step=1)
    lab_env.streams[job["id"]] = [
        {"id": 1, "event": "metrics", "data": {"step": 2, "values": {"reward/mean": 0.1}}},
        {"id": 2, "event": "status", "data": _status(job, status="failed", step=2)},
    ]

    status, out, _ = run(capsys, "jobs", "watch", job["id"], "--json")

    lines = [json.loads(line) for line in out.splitlines()]
    assert status == 1
    assert [(line["event"], line["data"].get("status"), line["data"]["step"]) for line in lines] == [
        ("status", "running", 1), ("metrics", None, 2), ("status", "failed", 2),
    ]


def _metric_points(lab_env, job):
    lab_env.metrics[job["id"]] = [
        {"step": step, "time": "2026-11-29T22:30:00Z", "attempt": 1,
         "values": {"reward/mean": step / 10, "loss/mean": 0.5, "entropy/mean": 1.25, "seq_len/mean": 24.0,
                    "optim/lr": 0.0001, "time/step": 9.5}}
        for step in (1, 2)
    ]


def test_metrics_default_to_the_main_ones(lab_env, capsys):
    job = lab_env.add_job()
    _metric_points(lab_env, job)

    status, out, _ = run(capsys, "jobs", "metrics", job["id"])

    assert status == 0
    assert [line.split() for line in out.splitlines()] == [
        ["STEP", "reward/mean", "loss/mean", "entropy/mean", "seq_len/mean"],
        ["1", "0.1", "0.5", "1.25", "24"],
        ["2", "0.2", "0.5", "1.25", "24"],
    ]
    assert lab_env.requests[-1].query["names"] == ["reward/mean,loss/mean,entropy/mean,seq_len/mean"]


def test_metrics_all_long_and_names(lab_env, capsys):
    job = lab_env.add_job()
    _metric_points(lab_env, job)

    _, every, _ = run(capsys, "jobs", "metrics", job["id"], "--all")
    _, long, _ = run(capsys, "jobs", "metrics", job["id"], "--names", "optim/lr,time/step", "--long")

    assert every.splitlines()[0].split() == [
        "STEP", "entropy/mean", "loss/mean", "optim/lr", "reward/mean", "seq_len/mean", "time/step",
    ]
    assert [line.split() for line in long.splitlines()] == [
        ["STEP", "NAME", "VALUE"],
        ["1", "optim/lr", "0.0001"], ["1", "time/step", "9.5"],
        ["2", "optim/lr", "0.0001"], ["2", "time/step", "9.5"],
    ]


def test_metrics_say_when_none_of_the_names_was_recorded(lab_env, capsys):
    job = lab_env.add_job()
    _metric_points(lab_env, job)

    status, out, err = run(capsys, "jobs", "metrics", job["id"], "--names", "eval/addition/mean")

    assert (status, out) == (0, "")
    assert err == "none of eval/addition/mean recorded; --all shows every metric\n"


def test_checkpoint_sizes_are_listed_in_decimal_si_units(lab_env, capsys):
    job = lab_env.add_job()
    lab_env.checkpoints[job["id"]] = [
        {"id": "ckpt_1", "object": "checkpoint", "job_id": job["id"], "step": 20, "attempt": 1, "status": "ready",
         "format": "peft-lora", "size_bytes": 62_634_496, "sha256": "ab", "created_at": "2026-11-29T22:30:00Z"},
    ]

    status, out, _ = run(capsys, "checkpoints", "list", job["id"])

    assert status == 0
    assert out.splitlines()[1].split()[:7] == ["ckpt_1", "20", "1", "ready", "peft-lora", "62.6", "MB"]
