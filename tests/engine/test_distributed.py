"""The data-parallel trainer (engine/distributed.py) under torchrun with 2 gloo processes on the
CPU gives the same losses and the same weights after N steps as one process with the same
global batch (within float tolerance: only the order of additions differs), in one process and
as the trainer role over the orchestrator role's shared directory, resumed too; a LoRA adapter
by summed gradients, a full fine-tune sharded with FSDP2, whose checkpoints resume in one
process as one process's resume under torchrun."""

import json
import sys

import pytest
import torch

from engine.distributed import DataParallel
from tests.support.distributed import (
    TORCHRUN,
    adapter_weights,
    assert_same_training,
    assert_same_weights,
    model_weights,
    run,
)

from .conftest import write_spec

STEPS = 3


def shard_log_lines(workdir):
    """The FSDP2 line each rank logged (rank 0's in the workdir, rank 1's under ranks/rank-1)."""
    lines = []
    for logs in (workdir / "logs.jsonl", workdir / "ranks" / "rank-1" / "logs.jsonl"):
        lines += [entry["line"] for entry in map(json.loads, logs.read_text().splitlines()) if entry["line"].startswith("FSDP2:")]
    return lines


def full_fine_tune_spec(tmp_path):
    """The tiny spec without LoRA (`lora_rank = 0`), a checkpoint after every step."""
    return write_spec(tmp_path / "spec.json", max_steps=STEPS, batch_size=16, rollouts_per_example=4, seed=3,
                      lora_rank=0, checkpoints={"interval": 1, "keep_last": STEPS})


def test_two_gloo_ranks_train_exactly_as_one_process(tmp_path):
    spec = write_spec(tmp_path / "spec.json", max_steps=STEPS, batch_size=16, rollouts_per_example=4, seed=3,
                      checkpoints={"interval": STEPS, "keep_last": 1})
    single_dir, single = run(tmp_path, "one", spec, [sys.executable])
    pair_dir, pair = run(tmp_path, "two", spec, TORCHRUN)

    assert sorted(pair) == sorted(single) == list(range(1, STEPS + 1))
    assert_same_training(pair, single)
    assert any(values["loss/mean"] != 0.0 for values in single.values())  # it trained
    assert_same_weights(adapter_weights(single_dir, STEPS), adapter_weights(pair_dir, STEPS))
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


def test_a_full_fine_tune_on_two_gloo_ranks_is_sharded_with_fsdp2_and_trains_exactly_as_one_process(tmp_path):
    spec = full_fine_tune_spec(tmp_path)
    single_dir, single = run(tmp_path, "one", spec, [sys.executable])
    pair_dir, pair = run(tmp_path, "two", spec, TORCHRUN)

    assert sorted(pair) == sorted(single) == list(range(1, STEPS + 1))
    assert_same_training(pair, single)
    assert any(values["loss/mean"] != 0.0 for values in single.values())  # it trained
    for step in range(1, STEPS + 1):
        assert_same_weights(model_weights(single_dir, step), model_weights(pair_dir, step))
    # Each rank holds half of the tiny model's 80,448 parameters (its dimensions are even).
    assert shard_log_lines(pair_dir) == [
        f"FSDP2: rank {rank} of 2 holds 40224 of the policy's 80448 parameters (50.0%) in 2 blocks + root" for rank in (0, 1)
    ]
    assert "FSDP2" not in (single_dir / "logs.jsonl").read_text()
    # The checkpoint is the one-process format: the same files, the same config and optimizer layout.
    one, two = (directory / "checkpoints" / "step-000003" for directory in (single_dir, pair_dir))
    assert sorted(p.relative_to(one) for p in one.rglob("*")) == sorted(p.relative_to(two) for p in two.rglob("*"))
    assert (one / "config.json").read_text() == (two / "config.json").read_text()
    state_one, state_two = (torch.load(d / "trainer_state" / "optimizer.pt", weights_only=True) for d in (one, two))
    assert state_one["param_groups"] == state_two["param_groups"] and list(state_one["state"]) == list(state_two["state"])


def test_a_full_fine_tune_resumes_exactly_across_fsdp2_and_one_process(tmp_path):
    """One process's checkpoint resumes on 2 FSDP2 ranks, theirs resumes on 2 ranks again and in
    one process: every resumed step equals the uninterrupted run's."""
    spec = full_fine_tune_spec(tmp_path)
    single_dir, single = run(tmp_path, "one", spec, [sys.executable])
    from_single_dir, from_single = run(tmp_path, "two-from-one", spec, TORCHRUN, None,
                                       "--resume-from", str(single_dir / "checkpoints" / "step-000001"))
    assert sorted(from_single) == [2, 3]
    assert_same_training(from_single, {step: single[step] for step in (2, 3)})
    assert_same_weights(model_weights(single_dir, STEPS), model_weights(from_single_dir, STEPS))

    checkpoint = from_single_dir / "checkpoints" / "step-000002"  # written by the 2 ranks
    again_dir, again = run(tmp_path, "two-from-two", spec, TORCHRUN, None, "--resume-from", str(checkpoint))
    one_dir, one = run(tmp_path, "one-from-two", spec, [sys.executable], None, "--resume-from", str(checkpoint))
    assert sorted(again) == sorted(one) == [3]
    assert_same_training(again, {3: from_single[3]})
    assert_same_training(one, {3: single[3]})
    assert_same_weights(model_weights(from_single_dir, STEPS), model_weights(again_dir, STEPS))
    assert_same_weights(model_weights(single_dir, STEPS), model_weights(one_dir, STEPS))


@pytest.mark.parametrize("size, shares", [(4, [[0, 1], [2, 3]]), (5, [[0, 1, 2], [3, 4]]), (1, [[0], []])])
def test_shards_are_contiguous_and_cover_every_group_once(size, shares):
    assert [DataParallel(rank=r, world_size=2).shard(range(size)) for r in range(2)] == shares


def test_one_process_is_a_no_op():
    parallel = DataParallel.from_environment({})
    assert parallel == DataParallel(0, 1) and parallel.is_main
    assert parallel.sum([1.5, 2.0]) == [1.5, 2.0] and parallel.any(True) is True
    with pytest.raises(ValueError, match="RANK 2 is not in 0..1"):
        DataParallel.from_environment({"WORLD_SIZE": "2", "RANK": "2"})
