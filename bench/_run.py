"""Run every benchmark (what `make bench` does) and say at the end which failed.

    python bench/_run.py [SCRIPT ...]

Runs each script (default: every `bench/*.py` whose name does not start with `_`, in name order)
with this Python from the repository root, one after the other, whatever the ones before it
did: their JSON lines (docs/architecture.md "Tests and benchmarks") go to stdout as printed,
their progress to stderr. A benchmark that cannot run on this machine (the GPU check without
CUDA) prints a line with `"not_run"` and exits 0. Afterwards stderr gets each script's exit
status and wall seconds, and the names of those that failed; the exit status is 1 when any
failed (exited nonzero), else 0.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH_DIR = REPO_ROOT / "bench"


def default_scripts() -> list[pathlib.Path]:
    """Every benchmark script in `bench/`: its `*.py` files but the helpers (`_*.py`), by name."""
    return sorted(path for path in BENCH_DIR.glob("*.py") if not path.name.startswith("_"))


def log(message: str) -> None:
    """Progress on stderr (stdout carries the benchmarks' JSON lines alone)."""
    print(message, file=sys.stderr, flush=True)


def run_all(scripts: list[pathlib.Path]) -> list[tuple[pathlib.Path, int, float]]:
    """Run `scripts` in turn; return each one's `(script, exit status, wall seconds)`."""
    results = []
    for script in scripts:
        log(f"bench: {script.name}")
        started = time.monotonic()
        returncode = subprocess.run([sys.executable, str(script)], cwd=REPO_ROOT, check=False).returncode
        results.append((script, returncode, time.monotonic() - started))
        log(f"bench: {script.name} exited {returncode} after {results[-1][2]:.0f} s")
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the scripts named in `argv` (default: every benchmark); return 1 when one failed, else 0."""
    arguments = sys.argv[1:] if argv is None else argv
    scripts = [pathlib.Path(name).resolve() for name in arguments] or default_scripts()
    results = run_all(scripts)
    log("bench: " + ", ".join(f"{script.name} {returncode} ({seconds:.0f} s)" for script, returncode, seconds in results))
    failed = [script.name for script, returncode, _ in results if returncode != 0]
    if failed:
        log(f"bench: {len(failed)} of {len(results)} failed: {', '.join(failed)}")
        return 1
    log(f"bench: none of {len(results)} failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
