"""Benchmark: how long an environment build takes for a package on a real PyPI package.

Builds the test package ``REASONING_GYM`` (tests/support/load_environment_wheels.py: a
``load_environment`` module requiring ``verifiers>=0.1.0``, ``reasoning-gym`` and ``datasets``,
so verifiers 0.3.1 plus reasoning-gym's closure, three of whose distributions are source archives
that the build makes wheels of) with the builder a build task runs (``python -m
environments.builder build``, the import step in bubblewrap unless ``--sandbox none``) against the
local package index (``make package-index``; never a remote one), and prints
docs/architecture.md "Tests and benchmarks" JSON lines:

- ``environment_build_s`` with ``wheelhouse: "cold"``: an empty wheelhouse and an empty uv cache
  (every wheel fetched, every source archive built);
- ``environment_build_s`` with ``wheelhouse: "warm"``: a second build of the same package on that
  wheelhouse and cache, in a fresh folder (nothing fetched or built again), ``--warm`` times.

Each figure is the builder's wall time from start to the result (``ready``); what Lab adds around
it (the task's queueing, storing the log) is not in it. Goal: warm <= 60 s on 2 cores.

    python bench/environment_build.py [--warm 2] [--sandbox bubblewrap|none]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_INDEX = REPO_ROOT / "var" / "package-index"
GOAL_WARM_S = 60.0


def _line(name: str, value: float, unit: str, **extra) -> None:
    print(json.dumps({"name": name, "value": round(value, 2), "unit": unit, **extra}), flush=True)


def _build(root: pathlib.Path, wheel: pathlib.Path, run: str, sandbox: str) -> tuple[float, dict]:
    """Build ``wheel`` in ``root/<run>`` on the wheelhouse and uv cache of ``root``; return (seconds, result)."""
    result = root / f"{run}.json"
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "environments.builder",
            "build",
            "--wheel",
            str(wheel),
            "--index-url",
            (PACKAGE_INDEX / "simple").as_uri(),
            "--exclude-newer",
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "--wheelhouse",
            str(root / "wheelhouse"),
            "--workdir",
            str(root / run),
            "--result",
            str(result),
            "--cache",
            str(root / "uv-cache"),
            "--sandbox",
            sandbox,
        ],
        cwd=REPO_ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - started
    built = json.loads(result.read_text())
    if built["status"] != "ready":
        raise SystemExit(f"the {run} build failed: {built['error']}")
    shutil.rmtree(root / run)
    return elapsed, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=2, help="how many warm builds to time")
    parser.add_argument(
        "--sandbox", choices=["bubblewrap", "none"], default="bubblewrap" if shutil.which("bwrap") else "none"
    )
    options = parser.parse_args()
    if not (PACKAGE_INDEX / ".filled").is_file():
        raise SystemExit("the local package index is missing: run `make package-index`")
    sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk")]
    from tests.support.load_environment_wheels import reasoning_gym_wheel

    with tempfile.TemporaryDirectory() as temporary:
        root = pathlib.Path(temporary)
        filename, data = reasoning_gym_wheel()
        wheel = root / filename
        wheel.write_bytes(data)
        common = {"cores": os.cpu_count(), "sandbox": options.sandbox}
        seconds, built = _build(root, wheel, "cold", options.sandbox)
        locked = {entry["name"]: entry["version"] for entry in built["lock"]}
        common |= {
            "wheels": len(locked),
            "verifiers": locked.get("verifiers"),
            "reasoning_gym": locked.get("reasoning-gym"),
        }
        _line("environment_build_s", seconds, "s", wheelhouse="cold", **common)
        for run in range(options.warm):
            seconds, _ = _build(root, wheel, f"warm-{run}", options.sandbox)
            _line("environment_build_s", seconds, "s", wheelhouse="warm", run=run + 1, goal=GOAL_WARM_S, **common)


if __name__ == "__main__":
    main()
