"""Expert routing of a mixture-of-experts policy, measured while it trains: the router's
auxiliary load-balancing loss and each expert's load, as step metrics.

transformers names a mixture-of-experts model's router class in its `_can_record_outputs`
(`"router_logits"`, what `output_router_logits=True` collects). That option cannot be used in
the policy's forward pass: with `output_router_logits` the causal LM computes its auxiliary loss
against the `attention_mask` it was given, which for the completions' pass (run on a key/value
cache, engine.policy.completion_logits) covers the prompt as well and no longer matches the
router's rows. So forward hooks on the router modules read the same logits, and the padding
is left out with masks `completion_logits` sets for each of its two passes.

The loss is transformers' `load_balancing_loss_func` (Switch Transformer, Fedus et al. 2021,
eqs. 4-6): E · Σ_e f_e · P_e over every MoE layer's real tokens, f_e the fraction of top-k
assignments expert e got, P_e its mean router probability; it is `top_k` when the load is
perfectly even. It is reported, not added to the GRPO loss.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from engine.distributed import DataParallel


class RouterStatistics:
    """Top-k assignment counts and router probability sums per MoE layer, accumulated over the
    forward passes of one optimizer step; `metrics()` reports them and starts over.

    Build it with `attach(model)`; `expect(mask)` before each forward pass to count (the
    policy's passes of engine.policy.completion_logits), `expect(None)` after. The routers
    run in other passes too (a sampler sharing the trainer's weights, in its own thread or
    this one): only passes announced by `expect`, in the thread that announced them, count.
    """

    def __init__(self, routers: list[torch.nn.Module], num_experts: int, top_k: int, index: int = 0):
        self.num_experts, self.top_k, self.index = num_experts, top_k, index
        self.mask: torch.Tensor | None = None
        self._thread: int | None = None
        self._layers = {id(router): layer for layer, router in enumerate(routers)}
        self._reset()
        self._handles = [router.register_forward_hook(self._hook) for router in routers]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> RouterStatistics | None:
        """Hook the routers of `model` (a transformers model, possibly wrapped by peft or FSDP);
        None when it has none (a dense model)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        recorder = getattr(base, "_can_record_outputs", None) or {}
        spec = recorder.get("router_logits")
        router_class = getattr(spec, "target_class", spec)
        config = getattr(base, "config", None)
        num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
        top_k = getattr(config, "num_experts_per_tok", None)
        if not isinstance(router_class, type) or not num_experts or not top_k:
            return None
        routers = [module for module in model.modules() if isinstance(module, router_class)]
        if not routers:
            return None
        return cls(routers, int(num_experts), int(top_k), int(getattr(spec, "index", 0) or 0))

    def expect(self, mask: torch.Tensor | None) -> None:
        """Count the next forward passes of this thread over a batch whose real tokens are
        `mask` (long or bool [batch, sequence], 1 on a token to count); None: count nothing."""
        self.mask = mask
        self._thread = threading.get_ident() if mask is not None else None

    def _reset(self) -> None:
        layers = len(self._layers)
        self.assignments = torch.zeros(layers, self.num_experts, dtype=torch.float64)
        self.probabilities = torch.zeros(layers, self.num_experts, dtype=torch.float64)
        self.tokens = torch.zeros(layers, dtype=torch.float64)

    def _hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        mask = self.mask
        if mask is None or threading.get_ident() != self._thread:
            return
        logits = output[self.index] if isinstance(output, tuple) else output
        with torch.no_grad():
            logits = logits.detach().reshape(-1, self.num_experts).float()
            if mask.numel() != logits.shape[0]:
                return
            weights = mask.reshape(-1).to(device=logits.device, dtype=torch.float32)
            probabilities = torch.softmax(logits, dim=-1)
            chosen = torch.topk(probabilities, self.top_k, dim=-1).indices
            counts = torch.zeros(self.num_experts, dtype=torch.float32, device=logits.device)
            counts.scatter_add_(0, chosen.reshape(-1), weights.repeat_interleave(self.top_k))
            layer = self._layers[id(module)]
            self.assignments[layer] += counts.double().cpu()
            self.probabilities[layer] += (probabilities * weights.unsqueeze(-1)).sum(0).double().cpu()
            self.tokens[layer] += float(weights.sum())

    def metrics(self, parallel: DataParallel | None = None) -> dict[str, float]:
        """Return this step's routing metrics, summed over the ranks of `parallel` (every rank
        must call it), and start counting anew:

        - `moe/aux_loss`: the load-balancing loss (module docstring), `top_k` when even;
        - `moe/expert_load/max`, `moe/expert_load/min`: the largest and smallest share of a
          layer's top-k assignments any expert got, times the number of experts (1.0 is an even
          load; 0 is an expert no token chose).

        Empty when no token went through the routers.
        """
        values = [*self.assignments.flatten().tolist(), *self.probabilities.flatten().tolist(), *self.tokens.tolist()]
        if parallel is not None:
            values = parallel.sum(values)
        cells = self.assignments.numel()
        assignments = torch.tensor(values[:cells], dtype=torch.float64).view_as(self.assignments)
        probabilities = torch.tensor(values[cells:2 * cells], dtype=torch.float64).view_as(self.probabilities)
        tokens = torch.tensor(values[2 * cells:], dtype=torch.float64)
        self._reset()
        total = float(tokens.sum())
        if total <= 0:
            return {}
        aux_loss = self.num_experts * float(((assignments.sum(0) / total) * (probabilities.sum(0) / total)).sum())
        routed = tokens > 0
        load = assignments[routed] / (tokens[routed].unsqueeze(-1) * self.top_k) * self.num_experts
        return {"moe/aux_loss": aux_loss, "moe/expert_load/max": float(load.max()), "moe/expert_load/min": float(load.min())}

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
