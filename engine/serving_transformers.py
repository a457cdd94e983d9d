"""The serving role's backend on transformers (engine/serving.py): a causal LM and the LoRA
adapters loaded on it through transformers' own peft integration, sampled one token at a time."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import torch


class TransformersServing:
    """Sample from a transformers causal LM and the LoRA adapters loaded on it (transformers'
    own peft integration: `load_adapter`, `set_adapter`, `disable_adapters`, `delete_adapter`).

    `model`: the base model (eval mode) or a full checkpoint's; `stop_token_ids`: what ends a
    completion. Sampling draws from a private seeded `torch.Generator`, one token at a time over
    the key/value cache, so a stream yields each token as soon as it is sampled.
    """

    name = "transformers"

    def __init__(self, model: Any, *, stop_token_ids: list[int]):
        self.model = model
        self.stop_token_ids = frozenset(stop_token_ids)
        self.loaded: set[str] = set()

    def load_adapter(self, name: str, directory: pathlib.Path) -> None:
        """Load the peft adapter in `directory` under `name`. Raises ValueError when it does not fit."""
        try:
            self.model.load_adapter(str(directory), adapter_name=name)
        except (ValueError, KeyError, RuntimeError, OSError) as error:
            raise ValueError(f"the adapter does not fit the model: {str(error)[:300]}") from None
        self.loaded.add(name)

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter `name` (its memory is freed)."""
        if name in self.loaded:
            self.model.delete_adapter(name)
            self.loaded.discard(name)

    def _apply(self, adapter: str | None) -> None:
        if not self.loaded:
            return
        if adapter is None:
            self.model.disable_adapters()
        else:
            self.model.enable_adapters()
            self.model.set_adapter(adapter)

    @torch.no_grad()
    def tokens(
        self, prompt_ids: list[int], *, adapter: str | None, max_tokens: int, temperature: float, top_p: float, seed: int,
    ) -> Iterator[int]:
        """Yield up to `max_tokens` sampled token ids, a stop token last when one is sampled."""
        self._apply(adapter)
        generator = torch.Generator().manual_seed(seed)
        output = self.model(input_ids=torch.tensor([prompt_ids]), use_cache=True, logits_to_keep=1)
        for _ in range(max_tokens):
            token = _pick(output.logits[0, -1, :].float(), temperature=temperature, top_p=top_p, generator=generator)
            yield token
            if token in self.stop_token_ids:
                return
            output = self.model(input_ids=torch.tensor([[token]]), past_key_values=output.past_key_values, use_cache=True)

    def close(self) -> None:
        """Nothing to release: the model goes with the process."""


def _pick(logits: torch.Tensor, *, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """One token id from `logits`: the most likely at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the smallest set of tokens holding `top_p` of it."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probabilities = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probabilities, descending=True)
        outside = torch.cumsum(ordered, dim=-1) - ordered > top_p
        ordered[outside] = 0.0
        probabilities = torch.zeros_like(probabilities).scatter(0, order, ordered)
    return int(torch.multinomial(probabilities, 1, generator=generator))
