"""The engine CLI run as a subprocess on a spec file."""

import os
import subprocess
import sys

from tests.engine.conftest import REPO_ROOT


def engine(args, tmp_path, *, env=None, offline=True, **popen):
    command = [sys.executable, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1",
               "--workdir", str(tmp_path / "work"), *args]
    if offline:
        command.append("--offline")
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}", **(env or {})}
    return subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(process, timeout=120):
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr
