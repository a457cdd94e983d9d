"""Benchmark: the engine's start-up, the wall seconds of `python -m engine` processes that end
before any model loads, as many tests start them.

`engine_help_s`: `python -m engine --help`. `engine_refusal_s`: an offline `run` of a spec the
engine refuses (a batch that is no whole number of groups: exit 2, one line on stderr, the
attempt's `finish.json` written), which checks the spec before it imports the trainer, so pays
for torch but not for transformers or peft. Each figure is the median of `--runs` processes
(default 5) on this machine, one after another, with the median CPU seconds (user and system) as
`cpu_s`, which a busy machine disturbs less than the wall time; no baseline: the figure is
compared with itself over time.

    python bench/engine_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _django import REPO, report

#: A spec the engine refuses once it has read it: 6 rollouts are no whole number of groups of 4.
REFUSED_SPEC = {
    "model": "lab/tiny-random-llama", "max_steps": 1, "batch_size": 6, "rollouts_per_example": 4,
    "env": [{"id": "lab/reverse-text"}],
}


def timed(command: list[str], *, expected: int, env: dict[str, str]) -> tuple[float, float]:
    """Run `command` from the repository root; return its (wall seconds, CPU seconds). Raises
    RuntimeError when it exits other than `expected`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != expected:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}, not {expected}: {done.stderr[-2000:]}")
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lab-bench-startup-") as scratch:
        scratch = Path(scratch)
        spec = scratch / "spec.json"
        spec.write_text(json.dumps(REFUSED_SPEC))
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'sdk'}", "LAB_MODEL_DIR": str(scratch / "models")}
        help_command = [sys.executable, "-m", "engine", "--help"]
        refusal = [
            sys.executable, "-m", "engine", "run", "--spec", str(spec), "--job-id", "job_bench", "--attempt", "1",
            "--workdir", str(scratch / "work"), "--offline",
        ]
        help_runs = [timed(help_command, expected=0, env=env) for _ in range(args.runs)]
        refusal_runs = [timed(refusal, expected=2, env=env) for _ in range(args.runs)]
    for name, runs in (("engine_help_s", help_runs), ("engine_refusal_s", refusal_runs)):
        wall = [seconds for seconds, _ in runs]
        report(name, statistics.median(wall), "s", None, runs=args.runs, min=round(min(wall), 3), max=round(max(wall), 3),
               cpu_s=round(statistics.median(cpu for _, cpu in runs), 3), cpus=os.cpu_count())


if __name__ == "__main__":
    main()
