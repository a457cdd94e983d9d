"""A tiny supervisor for one local engine attempt: ``python -m jobs.launchers.supervise``.

It detaches from its parent (so a restarted Celery worker neither kills nor reaps it), runs the
engine as a child in its own process group with stdout and stderr in files of the work dir,
forwards SIGTERM, and when the engine ends writes ``exit.json`` (``{"exit_code": N}``, negative
for a signal). The launcher reads ``supervisor.pid``, ``engine.pid`` and ``exit.json`` to observe.

Usage: ``python -m jobs.launchers.supervise WORKDIR -- COMMAND...`` (the environment passes on).
Imports nothing from Django. The environment it passes on holds the job token, so it makes itself
non-dumpable first, as the engine does (``engine.cli._guard_credentials``): environment code,
running as the same user below it, cannot read its ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def supervise(workdir: Path, command: list[str]) -> int:
    """Run ``command`` to completion under supervision and record its exit code; return it."""
    stdout = open(workdir / "stdout.log", "ab")
    stderr = open(workdir / "stderr.log", "ab")
    engine = subprocess.Popen(
        command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True
    )
    _write_atomically(workdir / "engine.pid", str(engine.pid))

    def forward(signum, frame):
        try:
            os.killpg(engine.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    exit_code = engine.wait()
    _write_atomically(workdir / "exit.json", json.dumps({"exit_code": exit_code}))
    return exit_code


def main(argv: list[str]) -> None:
    """Detach (double fork), then supervise. The first process exits 0 once the pid file exists."""
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m jobs.launchers.supervise WORKDIR -- COMMAND...\n")
        raise SystemExit(2)
    workdir, command = Path(argv[0]), argv[2:]
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # PR_SET_DUMPABLE (linux/prctl.h)
    except (OSError, AttributeError):  # not Linux
        pass
    if os.fork() > 0:
        # The launcher waits for this first process; the pid file is written by the grandchild.
        for _ in range(200):
            if (workdir / "supervisor.pid").exists():
                os._exit(0)
            time.sleep(0.01)
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _write_atomically(workdir / "supervisor.pid", str(os.getpid()))
    try:
        supervise(workdir, command)
    finally:
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
