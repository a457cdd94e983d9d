"""The tiny model with a LoRA adapter, for the tests that save, download or load one (needs torch,
peft and transformers)."""

from __future__ import annotations

from pathlib import Path

import peft
import torch
import transformers

from engine.models import tiny_random_llama
from engine.policy import make_trainable

TINY = "lab/tiny-random-llama"


def tiny_lora(fill: float, seed: int = 0):
    """Return ``(model, tokenizer)``: the tiny model with a rank-4 LoRA adapter whose ``lora_B``
    weights are all ``fill`` and whose ``lora_A`` weights are peft's random start drawn from
    ``seed`` (the same adapter on every call), so that (non-zero) it changes what the model predicts."""
    base, tokenizer = tiny_random_llama()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = make_trainable(base, lora_rank=4, lora_alpha=8, base_model_id=TINY)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(fill)
    return model, tokenizer


def adapter_changes_predictions(directory: Path) -> bool:
    """Load the PEFT adapter saved in ``directory`` (with its tokenizer) on the tiny base model and
    return whether it changes the logits of a short chat prompt."""
    base, _ = tiny_random_llama()
    model = peft.PeftModel.from_pretrained(base, str(directory))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "abc"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        tuned = model(**prompt).logits
        with model.disable_adapter():
            plain = model(**prompt).logits
    return not torch.allclose(tuned, plain)
