"""The data-parallel trainer (engine/distributed.py) under torchrun with 2 gloo processes on the
CPU gives the same losses and the same weights after N steps as one process with the same
global batch (within float tolerance: only the order of additions differs), in one process and
as the trainer role over the orchestrator role's shared directory, resumed too."""

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from engine.distributed import DataParallel

from .conftest import REPO_ROOT, write_spec

STEPS = 3


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def run(tmp_path, name, spec, launcher, environ=None, *extra):
    environment = {**os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
                   "OMP_NUM_THREADS": "1", **(environ or {})}
    workdir = tmp_path / name
    done = subprocess.run(
        [*launcher, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1", "--workdir", str(workdir),
         "--spec", str(spec), "--offline", *extra],
        cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    points = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return workdir, {point["step"]: point["values"] for point in points}


def adapter_weights(workdir, step=STEPS):
    (path,) = (workdir / "checkpoints").glob(f"*{step}/adapter_model.safetensors")
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


def test_two_gloo_ranks_train_exactly_as_one_process(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=STEPS, batch_size=16, rollouts_per_example=4, seed=3,
                      checkpoints={"interval": STEPS, "keep_last": 1})
    single_dir, single = run(tmp_path, "one", spec, [sys.executable])
    pair_dir, pair = run(tmp_path, "two", spec, TORCHRUN)

    assert sorted(pair) == sorted(single) == list(range(1, STEPS + 1))
    assert_same_training(pair, single)
    assert any(values["loss/mean"] != 0.0 for values in single.values())  # it trained
    assert_same_weights(adapter_weights(single_dir), adapter_weights(pair_dir))
    # Rank 1 trained too, but wrote no checkpoint and reported nothing to rank 0's outputs.
    rank1 = pair_dir / "ranks" / "rank-1"
    assert (rank1 / "metrics.jsonl").is_file() and not (rank1 / "checkpoints").exists()


def test_the_trainer_role_on_two_gloo_ranks_trains_as_one_and_resumes(tmp_path):
    """`LAB_ENGINE_ROLES=process` under torchrun: rank 0 starts the inference and orchestrator
    roles, both ranks train on the orchestrator's batches from the shared directory; then a
    resume, whose checkpoint rank 0 resolves for both ranks."""
    spec = write_spec(tmp_path / "spec.json", max_steps=2, batch_size=16, rollouts_per_example=4, seed=3,
                      checkpoints={"interval": 1, "keep_last": 2})
    roles = {"LAB_ENGINE_ROLES": "process"}
    single_dir, single = run(tmp_path, "one", spec, [sys.executable], roles)
    pair_dir, pair = run(tmp_path, "two", spec, TORCHRUN, roles)

    assert sorted(pair) == sorted(single) == [1, 2]
    assert_same_training(pair, single)
    assert_same_weights(adapter_weights(single_dir, 2), adapter_weights(pair_dir, 2))
    assert not (pair_dir / "ranks" / "rank-1" / "orchestrator").exists()  # rank 0 alone started the roles

    checkpoint = pair_dir / "checkpoints" / "step-000001"
    resumed_dir, resumed = run(tmp_path, "resumed", spec, TORCHRUN, roles, "--resume-from", str(checkpoint))
    assert sorted(resumed) == [2]
    assert_same_training(resumed, {2: pair[2]})
    assert_same_weights(adapter_weights(pair_dir, 2), adapter_weights(resumed_dir, 2))


@pytest.mark.parametrize("size, shares", [(4, [[0, 1], [2, 3]]), (5, [[0, 1, 2], [3, 4]]), (1, [[0], []])])
def test_shards_are_contiguous_and_cover_every_group_once(size, shares):
    assert [DataParallel(rank=r, world_size=2).shard(range(size)) for r in range(2)] == shares


def test_one_process_is_a_no_op():
    parallel = DataParallel.from_environment({})
    assert parallel == DataParallel(0, 1) and parallel.is_main
    assert parallel.sum([1.5, 2.0]) == [1.5, 2.0] and parallel.any(True) is True
    with pytest.raises(ValueError, match="RANK 2 is not in 0..1"):
        DataParallel.from_environment({"WORLD_SIZE": "2", "RANK": "2"})
