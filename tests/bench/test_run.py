"""bench/_run.py, what `make bench` runs: every benchmark in turn, also after one fails, their
JSON lines on stdout as printed, and at the end (stderr) which failed, with exit status 1."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = REPO_ROOT / "bench" / "_run.py"


def load_runner():
    module_spec = importlib.util.spec_from_file_location("bench_run", RUNNER)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def script(directory: pathlib.Path, name: str, body: str) -> pathlib.Path:
    path = directory / name
    path.write_text(body)
    return path


def run(*scripts: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), *map(str, scripts)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


def test_it_runs_every_script_after_one_fails_and_names_the_failed_ones_at_the_end(tmp_path):
    first = script(tmp_path, "first.py", 'print(\'{"name": "first", "value": 1.0}\')\n')
    broken = script(tmp_path, "broken.py", "import sys\nsys.exit(3)\n")
    skipped = script(tmp_path, "skipped.py", 'print(\'{"name": "skipped", "value": null, "not_run": "no GPU"}\')\n')
    crashed = script(tmp_path, "crashed.py", "raise RuntimeError('boom')\n")

    done = run(first, broken, skipped, crashed)

    assert done.returncode == 1
    assert done.stdout.splitlines() == ['{"name": "first", "value": 1.0}', '{"name": "skipped", "value": null, "not_run": "no GPU"}']
    assert "RuntimeError: boom" in done.stderr
    assert done.stderr.splitlines()[-1] == "bench: 2 of 4 failed: broken.py, crashed.py"
    assert [line.split(" after ")[0] for line in done.stderr.splitlines() if " exited " in line] == [
        "bench: first.py exited 0", "bench: broken.py exited 3", "bench: skipped.py exited 0", "bench: crashed.py exited 1"]


def test_it_exits_0_when_none_failed(tmp_path):
    done = run(script(tmp_path, "one.py", "pass\n"), script(tmp_path, "two.py", "pass\n"))

    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr.splitlines()[-1] == "bench: none of 2 failed"


def test_by_default_it_runs_every_benchmark_and_no_helper():
    names = [path.name for path in load_runner().default_scripts()]

    assert names == sorted(path.name for path in (REPO_ROOT / "bench").glob("*.py") if not path.name.startswith("_"))
    assert {"gpu_check.py", "ingest.py", "k8s_reconcile.py", "sse.py", "webhooks.py"} <= set(names)
    assert "_django.py" not in names and "_run.py" not in names


def test_make_bench_runs_the_runner():
    # --no-print-directory: under make test (CI) this make is a sub-make, which names its directory.
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "bench"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == ".venv/bin/python bench/_run.py"
