"""The tiny mixture of experts under torchrun with 2 gloo processes trains as one process with the
same global batch: LoRA by summed gradients (its experts' 3-D LoRA weights too), full weights
sharded with FSDP2 (tests/engine/test_distributed.py does the same for the tiny Llama)."""

import sys

import pytest

from engine.catalog import TINY_RANDOM_QWEN3_MOE_ID
from tests.support.distributed import (
    TORCHRUN,
    adapter_weights,
    assert_same_training,
    assert_same_weights,
    model_weights,
    run,
)

from .conftest import write_spec

STEPS = 2


@pytest.mark.parametrize("lora_rank", [4, 0], ids=["lora", "full"])
def test_a_mixture_of_experts_trains_on_two_gloo_ranks_as_in_one_process(tmp_path, lora_rank):
    spec = write_spec(tmp_path / "spec.json", model=TINY_RANDOM_QWEN3_MOE_ID, max_steps=STEPS, batch_size=16,
                      rollouts_per_example=4, seed=3, lora_rank=lora_rank, checkpoints={"interval": 0, "keep_last": 1},
                      # AdamW moves a coordinate with a near-zero gradient by about the learning rate either
                      # way, so the ranks' float rounding shows at that scale: 1e-3 keeps it within tolerance.
                      learning_rate=1e-3)
    single_dir, single = run(tmp_path, "one", spec, [sys.executable])
    pair_dir, pair = run(tmp_path, "two", spec, TORCHRUN)
    assert sorted(pair) == sorted(single) == list(range(1, STEPS + 1))
    assert_same_training(pair, single)
    for step in single:  # the routing metrics are summed over the ranks
        for name in ("moe/aux_loss", "moe/expert_load/max", "moe/expert_load/min"):
            assert pair[step][name] == pytest.approx(single[step][name], rel=1e-4), (step, name)
    weights = adapter_weights if lora_rank else model_weights
    one, two = weights(single_dir, STEPS), weights(pair_dir, STEPS)
    assert any(".mlp.experts" in name for name in one)
    assert_same_weights(one, two)
