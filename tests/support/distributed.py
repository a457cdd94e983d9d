"""Engine runs under torchrun with 2 gloo processes on the CPU, and the checks that they train as
one process does, shared by the data-parallel trainer's test modules."""

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from tests.engine.conftest import REPO_ROOT

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def run(tmp_path, name, spec, launcher, environ=None, *extra):
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
                   "OMP_NUM_THREADS": "1", **(environ or {})}
    workdir = tmp_path / name
    done = subprocess.run(
        [*launcher, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1", "--workdir", str(workdir),
         "--spec", str(spec), "--offline", *extra],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return workdir, {point["step"]: point["values"] for point in points}


def adapter_weights(workdir, step):
    (path,) = (workdir / "checkpoints").glob(f"*{step}/adapter_model.safetensors")
    return load_file(str(path))


def model_weights(workdir, step):
    (path,) = (workdir / "checkpoints").glob(f"*{step}/model.safetensors")
    return load_file(str(path))


def assert_same_training(pair, single):
    for step in single:
        assert pair[step]["reward/mean"] == single[step]["reward/mean"]
        for name in ("loss/mean", "optim/grad_norm", "entropy/mean"):
            assert pair[step][name] == pytest.approx(single[step][name], rel=1e-4, abs=1e-7), (step, name)


def assert_same_weights(one, two):
    assert one.keys() == two.keys() and one
    # AdamW scales each coordinate's update to about the learning rate (1e-2 here), so a
    # coordinate whose gradient is near zero carries float-rounding differences at that scale:
    # allow 1% of one step on the worst coordinate, and far less on average.
    for name in one:
        difference = (one[name] - two[name]).abs()
        assert difference.max() <= 1e-4 and difference.mean() <= 1e-6, name
