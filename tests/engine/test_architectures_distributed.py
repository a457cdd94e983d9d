"""Each architecture under torchrun with 2 gloo processes trains as one process with the same
global batch (tests/engine/test_distributed.py does the same for the tiny Llama): the mixture of
experts with LoRA by summed gradients (its experts' 3-D LoRA weights too) and with full weights
sharded with FSDP2; the dense Qwen2 and Qwen3 with full weights sharded with FSDP2 (which finds
each architecture's decoder blocks; LoRA's summed gradients have no per-architecture code)."""

import re
import sys

import pytest

from engine.catalog import TINY_RANDOM_QWEN2_ID, TINY_RANDOM_QWEN3_ID, TINY_RANDOM_QWEN3_MOE_ID
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


@pytest.mark.parametrize(("model_id", "lora_rank"), [
    (TINY_RANDOM_QWEN3_MOE_ID, 4), (TINY_RANDOM_QWEN3_MOE_ID, 0), (TINY_RANDOM_QWEN2_ID, 0), (TINY_RANDOM_QWEN3_ID, 0),
], ids=["qwen3-moe-lora", "qwen3-moe-full", "qwen2-full", "qwen3-full"])
def test_each_architecture_trains_on_two_gloo_ranks_as_in_one_process(tmp_path, model_id, lora_rank):
    moe = model_id == TINY_RANDOM_QWEN3_MOE_ID
    spec = write_spec(tmp_path / "spec.json", model=model_id, max_steps=STEPS, batch_size=16,
                      rollouts_per_example=4, seed=3, lora_rank=lora_rank, checkpoints={"interval": 0, "keep_last": 1},
                      # AdamW moves a coordinate with a near-zero gradient by about the learning rate either
                      # way, so the ranks' float rounding shows at that scale: 1e-3 keeps it within tolerance.
                      learning_rate=1e-3)
    single_dir, single = run(tmp_path, "one", spec, [sys.executable])
    pair_dir, pair = run(tmp_path, "two", spec, TORCHRUN)
    assert sorted(pair) == sorted(single) == list(range(1, STEPS + 1))
    assert_same_training(pair, single)
    for step in single:  # the routing metrics are summed over the ranks
        for name in ("moe/aux_loss", "moe/expert_load/max", "moe/expert_load/min") if moe else ():
            assert pair[step][name] == pytest.approx(single[step][name], rel=1e-4), (step, name)
    weights = adapter_weights if lora_rank else model_weights
    one, two = weights(single_dir, STEPS), weights(pair_dir, STEPS)
    assert any(".mlp.experts" in name for name in one) == moe
    assert_same_weights(one, two)
    if not lora_rank:  # sharded block by block, not replicated
        assert re.search(r"FSDP2: rank 1 of 2 holds \d+ of .* in [1-9]\d* blocks \+ root", (pair_dir / "ranks" / "rank-1" / "logs.jsonl").read_text())
