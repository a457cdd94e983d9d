"""Benchmark: what running a ``load_environment`` package on its build adds to a job's start, and
how fast its bridge scores single-turn rollouts.

Builds the test package ``DOUBLE_IT`` (tests/support/load_environment_wheels.py: verifiers
0.3.1 and ``datasets``) with the builder against the local package index (``make
package-index``; never a remote one), then hands it to ``engine.packages.install_packages`` as a
launch does (the build's lock with a ``file://`` wheelhouse URL per wheel) and measures, as
docs/architecture.md "Tests and benchmarks" JSON lines:

- ``environment_job_start_overhead_s``: from the package to a registered environment (the build's
  environment installed from its lock, or found installed; the bridge started, verifiers and the
  package imported, ``load_environment``'s parameters read), for a first job (an empty cache) and
  a second job on the same build (``job``: ``first`` or ``second``; ``install_s`` the install part);
- ``v0_bridge_rollouts_per_s``: single-turn rollouts scored per second through the bridge
  (``Environment.score``: verifiers' own rollout of the row with the reply, its parser and rubric),
  beside the built-in ``lab/reverse-text`` scoring in-process.

    python bench/load_environment_jobs.py [--scores 500]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_INDEX = REPO_ROOT / "var" / "package-index"
ENV_ID = "bench/double-it@0.1.0"


def _line(name: str, value: float, unit: str, **extra) -> None:
    print(json.dumps({"name": name, "value": round(value, 4), "unit": unit, **extra}), flush=True)


def _build(root: pathlib.Path, wheel: pathlib.Path) -> list[dict]:
    """Build ``wheel`` against the local index; return its lock with a wheelhouse URL per wheel."""
    result = root / "result.json"
    subprocess.run(
        [sys.executable, "-m", "environments.builder", "build", "--wheel", str(wheel),
         "--index-url", (PACKAGE_INDEX / "simple").as_uri(), "--exclude-newer", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "--wheelhouse", str(root / "wheelhouse"), "--workdir", str(root / "build"), "--result", str(result),
         "--cache", str(root / "uv-cache"), "--sandbox", "none"],
        cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
    )
    built = json.loads(result.read_text())
    if built["status"] != "ready":
        raise SystemExit(f"the build failed: {built['error']}")
    return [{**entry, "url": (root / "wheelhouse" / entry["sha256"] / entry["filename"]).as_uri()} for entry in built["lock"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", type=int, default=500)
    options = parser.parse_args()
    if not (PACKAGE_INDEX / ".filled").is_file():
        raise SystemExit("the local package index is missing: run `make package-index`")
    sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk")]
    from engine import build_envs, packages
    from engine.environments import load_environment
    from engine.environments.verifiers_taskset import close_bridges
    from tests.support.load_environment_wheels import double_it_wheel

    with tempfile.TemporaryDirectory() as temporary:
        root = pathlib.Path(temporary)
        filename, data = double_it_wheel()
        wheel = root / filename
        wheel.write_bytes(data)
        lock = _build(root, wheel)
        os.environ[build_envs.CACHE_VARIABLE] = str(root / "environments")
        package = packages.Package(
            id=ENV_ID, sha256=hashlib.sha256(data).hexdigest(), url=wheel.as_uri(), filename=filename,
            build={"number": 1, "api": "v0", "lock": lock},
        )
        for job in ("first", "second"):
            workdir = root / f"work-{job}"
            started = time.perf_counter()
            # The install part alone, then the whole start (which finds the environment installed by then).
            build_envs.ensure_environment(ENV_ID, lock, workdir, packages._fetch_locked(package), log=lambda _: None)
            installed = time.perf_counter()
            packages.install_packages([package], workdir)
            elapsed = time.perf_counter() - started
            _line("environment_job_start_overhead_s", elapsed, "s", job=job, install_s=round(installed - started, 4), wheels=len(lock))
            if job == "first":
                close_bridges()

        environment = load_environment(ENV_ID, {"num_examples": 64}, seed=0)
        examples = [environment.example(index, "train") for index in range(options.scores)]
        completions = ["<answer>4</answer>", "The answer is 8.", "", "<answer>12</answer> since 6 doubled is 12"]
        started = time.perf_counter()
        for index, example in enumerate(examples):
            environment.score(completions[index % len(completions)], example)
        bridge_rate = len(examples) / (time.perf_counter() - started)
        builtin = load_environment("lab/reverse-text", {}, seed=0)
        builtin_examples = [builtin.example(index, "train") for index in range(options.scores)]
        started = time.perf_counter()
        for index, example in enumerate(builtin_examples):
            builtin.score(completions[index % len(completions)], example)
        builtin_rate = len(builtin_examples) / (time.perf_counter() - started)
        _line("v0_bridge_rollouts_per_s", bridge_rate, "rollouts/s", baseline=round(builtin_rate, 1),
              baseline_name="lab/reverse-text in-process", scores=len(examples))
        close_bridges()


if __name__ == "__main__":
    main()
