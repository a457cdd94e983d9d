"""The engine run in its trainer, orchestrator and inference roles."""

import json
import os
import subprocess
import sys

from tests.engine.conftest import REPO_ROOT
from tests.support.engine import NONDETERMINISTIC_PREFIXES


def engine(tmp_path, spec, env, *extra, command="run", workdir="work"):
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
                   "LAB_ENGINE_WEIGHTS_DIR": str(tmp_path / "weights"), **env}
    return subprocess.Popen(
        [sys.executable, "-m", "engine", command, "--job-id", "job_1", "--attempt", "1", "--workdir", str(tmp_path / workdir),
         "--spec", str(spec), "--offline", *extra],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finished(process, timeout=900):
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def points(workdir):
    """step → metric values, the non-timing ones, merged as Lab merges a step's points."""
    merged = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        point = json.loads(line)
        values = {k: v for k, v in point["values"].items() if not k.startswith(NONDETERMINISTIC_PREFIXES)}
        merged.setdefault(point["step"], {}).update(values)
    return merged


SPEC = dict(max_steps=4, seed=3, max_off_policy_steps=2, checkpoints={"interval": 2, "keep_last": 3},
            eval={"interval": 2, "num_examples": 4, "eval_base_model": True})
