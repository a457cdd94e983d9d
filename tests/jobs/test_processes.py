"""jobs.processes.LabProcesses stops in order, on stand-in processes (no Lab started): beat and
the worker first, then the engine attempts of its data dir (SIGTERM, then SIGKILL after the
grace period), then web; a pid file whose number now belongs to another process is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import processes as processes_module
from jobs.launchers.local import process_alive
from jobs.processes import LabProcesses

#: A stand-in that writes "<name> <monotonic time>" to the stop file on SIGTERM, then exits.
STAND_IN = """
import signal, sys, time
name, stop_file = sys.argv[1], sys.argv[2]
def stop(signum, frame):
    with open(stop_file, "a") as out:
        out.write(f"{name} {time.monotonic()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
#: An engine stand-in that ignores SIGTERM (stuck), named after its work dir like a real one.
STUCK = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
)


def stand_in(name: str, stop_file: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", STAND_IN, name, str(stop_file), *extra]


def wait_ready(log: Path) -> None:
    deadline = time.monotonic() + 30
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"{log} never said ready"
        time.sleep(0.05)


def start_engine(workdir: Path, command: list[str]) -> subprocess.Popen:
    """Start a detached stand-in engine the way the supervisor does, its pid in engine.pid."""
    workdir.mkdir(parents=True)
    with open(workdir / "stdout.log", "wb") as log:
        engine = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (workdir / "engine.pid").write_text(str(engine.pid))
    wait_ready(workdir / "stdout.log")
    return engine


@pytest.fixture
def lab(tmp_path) -> LabProcesses:
    lab = LabProcesses(data_dir=tmp_path, port=9, env=dict(os.environ))
    yield lab
    lab.stop(engine_grace_s=0)


def test_it_stops_beat_and_worker_then_engines_then_web(lab, tmp_path):
    stops = tmp_path / "stops.txt"
    for name in ("web", "worker", "beat"):
        lab.spawn(name, stand_in(name, stops))
        wait_ready(lab.log_dir / f"{name}.log")
    workdir = tmp_path / "runs" / "job_a" / "attempt-1"
    engine = start_engine(workdir, stand_in("engine", stops, str(workdir)))

    lab.stop()

    order = [line.split()[0] for line in stops.read_text().splitlines()]
    assert sorted(order[:2]) == ["beat", "worker"] and order[2:] == ["engine", "web"]
    assert lab.processes == {}
    assert engine.wait(timeout=10) == 0  # it exited on SIGTERM, by itself


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace_period(lab, tmp_path):
    workdir = tmp_path / "runs" / "job_a" / "attempt-1"
    engine = start_engine(workdir, [sys.executable, "-c", STUCK, str(workdir)])
    started = time.monotonic()

    lab.stop(engine_grace_s=1)

    assert engine.wait(timeout=10) == -signal.SIGKILL
    assert 1 <= time.monotonic() - started < 10


def test_it_leaves_alone_a_process_that_took_a_stale_pid_files_number(lab, tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        workdir = tmp_path / "runs" / "job_a" / "attempt-1"
        workdir.mkdir(parents=True)
        (workdir / "engine.pid").write_text(str(bystander.pid))  # its command line does not name the work dir

        assert lab.engine_groups() == []
        lab.stop(engine_grace_s=0)

        assert process_alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_that_exits_is_named_with_its_log(lab):
    lab.spawn("worker", [sys.executable, "-c", "raise SystemExit(3)"])
    lab.processes["worker"].wait(timeout=30)

    with pytest.raises(RuntimeError) as raised:
        lab.check_alive()

    assert str(raised.value) == f"the worker process exited with status 3; see {lab.log_dir}/worker.log"


def test_it_reads_the_data_dir_as_lab_settings_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    assert processes_module.data_dir_from({"LAB_DATA_DIR": "data"}) == tmp_path / "data"
    assert processes_module.data_dir_from({"LAB_DATA_DIR": ""}) == processes_module.ROOT / "var"
    assert processes_module.data_dir_from({}) == processes_module.ROOT / "var"
