"""The transformers rollout backend (engine.rollout.TransformersBackend): rows that sample a stop
token leave the batch, and what the others sample is unchanged by it."""

import torch

from engine.grpo import token_logprobs_and_entropy
from engine.models import tiny_random_llama
from engine.policy import completion_logits, pack_rollouts
from engine.rollout import TransformersBackend

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15, 16, 17, 18]]


def backend_stopping_early():
    """The tiny model with an eighth of its vocabulary as stop tokens, so that rows stop at
    different steps."""
    model, tokenizer = tiny_random_llama()
    model.eval()
    vocabulary = model.config.vocab_size
    stops = list(range(0, vocabulary, 8))
    return TransformersBackend(model, pad_token_id=tokenizer.pad_token_id, stop_token_ids=stops), model, tokenizer, set(stops)


def test_greedy_rows_that_stop_early_leave_the_batch_and_the_rest_sample_as_alone():
    backend, _, _, stops = backend_stopping_early()
    together = backend.generate(PROMPTS, n=1, max_tokens=12, temperature=0, seed=0)
    alone = [backend.generate([prompt], n=1, max_tokens=12, temperature=0, seed=0)[0] for prompt in PROMPTS]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert [c.truncated for c in together] == [c.truncated for c in alone]
    for completion in together:  # a completion ends at its first stop token, or at max_tokens
        assert completion.truncated == (completion.token_ids[-1] not in stops)
        assert not any(token in stops for token in completion.token_ids[:-1])


def test_sampled_log_probabilities_are_the_policys_after_rows_leave():
    """The loss's importance ratio needs each sampled token's log-probability under the policy
    that sampled it: scoring the completions teacher-forced gives the same numbers."""
    backend, model, tokenizer, _ = backend_stopping_early()
    completions = backend.generate(PROMPTS, n=3, max_tokens=10, temperature=0.9, seed=7)
    lengths = {len(c.token_ids) for c in completions}
    assert len(lengths) >= 3 and any(c.truncated for c in completions) and not all(c.truncated for c in completions)
    packed = pack_rollouts(PROMPTS, [c.token_ids for c in completions], 3, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(completion_logits(model, packed), packed.completion_ids, 0.9)
    for row, completion in enumerate(completions):
        expected = logprobs[row, : len(completion.token_ids)]
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-5), row
    again = backend.generate(PROMPTS, n=3, max_tokens=10, temperature=0.9, seed=7)
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]  # deterministic per seed
