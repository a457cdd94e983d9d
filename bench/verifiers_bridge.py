"""Benchmark: what driving a verifiers taskset through the verifiers bridge costs the engine.

Builds the example verifiers package (examples/environments/shout-word, `make
example-verifiers-env`), installs it as a job's package would be (engine.packages: pip --target
into a work dir, a bridge started with .venv-verifiers' Python) and measures, as
docs/architecture.md "Tests and benchmarks" JSON lines:

- `verifiers_bridge_start_s`: from installing the package to a registered environment (the pip
  install, starting the bridge, importing verifiers and the package, describing the taskset),
  the median of `--starts` runs;
- `verifiers_open_s`: opening the taskset with the job's args (building verifiers' Env, reading
  its 2,000 tasks into splits);
- `verifiers_score_per_s`: completions scored per second through the bridge
  (`Environment.score`, one JSON round trip and one `task.score(trace)` each), baseline the
  built-in `lab/reverse-text` scoring in-process, which needs no round trip;
- `verifiers_examples_per_s`: training examples handed out per second (64 per request).

    python bench/verifiers_bridge.py [--scores 2000] [--starts 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV_ID = "bench/shout-word@0.1.0"


def _line(name: str, value: float, unit: str, **extra) -> None:
    print(json.dumps({"name": name, "value": round(value, 4), "unit": unit, **extra}), flush=True)


def _build_wheel(directory: pathlib.Path) -> pathlib.Path:
    subprocess.run(["make", "-s", "example-verifiers-env", f"EXAMPLE_DIST={directory}"], cwd=REPO_ROOT, check=True)
    (wheel,) = directory.glob("shout_word-*.whl")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", type=int, default=2000)
    parser.add_argument("--starts", type=int, default=3)
    options = parser.parse_args()
    sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "sdk")]
    from engine import packages
    from engine.environments import load_environment
    from engine.environments.verifiers_taskset import close_bridges

    with tempfile.TemporaryDirectory() as temporary:
        root = pathlib.Path(temporary)
        wheel = _build_wheel(root / "dist")
        package = packages.Package(
            id=ENV_ID, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), url=wheel.as_uri(), filename=wheel.name,
        )
        starts = []
        for run in range(options.starts):
            started = time.perf_counter()
            packages.install_packages([package], root / f"work-{run}")
            starts.append(time.perf_counter() - started)
            if run < options.starts - 1:
                close_bridges()
        _line("verifiers_bridge_start_s", statistics.median(starts), "s", runs=len(starts))

        started = time.perf_counter()
        environment = load_environment(ENV_ID, {}, seed=0)
        _line("verifiers_open_s", time.perf_counter() - started, "s", tasks=2000)

        started = time.perf_counter()
        examples = [environment.example(index, "train") for index in range(options.scores)]
        _line("verifiers_examples_per_s", len(examples) / (time.perf_counter() - started), "examples/s")

        completions = ["HELLO", "Sure! The word in capitals is BAKO.", "bako", ""]
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
        _line("verifiers_score_per_s", bridge_rate, "scores/s", baseline=round(builtin_rate, 1),
              ratio=round(bridge_rate / builtin_rate, 4), baseline_name="lab/reverse-text in-process", scores=len(examples))
        close_bridges()


if __name__ == "__main__":
    main()
