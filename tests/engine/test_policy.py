"""The policy's forward pass over groups of rollouts (engine.policy)."""

import torch

from engine.models import tiny_random_llama
from engine.policy import completion_logits, pack_rollouts


def test_groups_of_different_sizes_score_as_each_group_alone():
    model, tokenizer = tiny_random_llama()
    model.eval()
    pad = tokenizer.pad_token_id
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    completions = [[20, 21, 22], [23], [30, 31], [32, 33, 34, 35], [36], [37, 38], [40, 41, 42]]
    sizes = [2, 4, 1]
    packed = pack_rollouts(prompts, completions, sizes, pad)
    assert packed.group_size == [2, 4, 1] and packed.completion_ids.shape == (7, 4)
    with torch.no_grad():
        mixed = completion_logits(model, packed)
        first = 0
        for prompt, size in zip(prompts, sizes):
            alone = pack_rollouts([prompt], completions[first:first + size], size, pad)
            expected = completion_logits(model, alone)
            width = expected.shape[1]
            rows = packed.completion_mask[first:first + size, :width].bool()
            assert torch.allclose(mixed[first:first + size, :width][rows], expected[rows], atol=1e-5)
            first += size


def test_one_size_given_per_group_packs_as_the_fixed_size():
    packed = pack_rollouts([[1, 2], [3]], [[4], [5, 6], [7], [8]], [2, 2], 0)
    assert packed.group_size == 2
