"""The serving role's backend on vLLM (engine/serving.py; `python -m engine serve --backend vllm`):
vLLM's CPU build here, its CUDA build on GPU pods.

vLLM runs with LoRA (`enable_lora`, `max_lora_rank`: the highest adapter rank it will take, rounded
up to one it accepts) and as many adapter slots as the server keeps adapters loaded
(`max_loras` = `max_cpu_loras` = `--max-adapters`): an adapter is added as
`LoRARequest(<its name>, <a new id>, <its directory>)` when the server loads it and removed when the
server unloads it (its least recently used), and every request for it passes its `LoRARequest`.
Tokens are streamed from vLLM's engine loop (`LLMEngine.add_request`, `step`, with
`RequestOutputKind.DELTA`), so each is sent as soon as it is sampled; requests are served one at a
time, as by the transformers backend. Sampling: `temperature` (0 greedy), `top_p`, `top_k` off, a
seed per request; the stop token is part of the output when sampled.
"""

from __future__ import annotations

import itertools
import pathlib
import uuid
from collections.abc import Iterable, Iterator

import torch

from engine.config import lora_rank_bound, set_defaults
from engine.policy import read_adapter_config
from engine.vllm_backend import configure_cpu


class VLLMServing:
    """Sample with vLLM from a Hugging Face model directory and the LoRA adapters added to it.

    `model_path`: the base model's (or a full checkpoint's) directory; `max_model_len`: prompt plus
    completion tokens; `max_adapters`: adapter slots; `max_lora_rank`: the highest adapter rank
    taken (higher ones are refused when loaded); `dtype`: vLLM's compute dtype. Raises ImportError
    without vLLM, ValueError for a rank vLLM cannot serve.
    """

    name = "vllm"

    def __init__(
        self, model_path: pathlib.Path, *, max_model_len: int, stop_token_ids: Iterable[int], workdir: pathlib.Path,
        max_adapters: int, max_lora_rank: int, dtype: str = "bfloat16", seed: int = 0, gpu_memory_utilization: float = 0.85,
    ):
        self.stop_token_ids = frozenset(stop_token_ids)
        self.max_lora_rank = lora_rank_bound(max_lora_rank)
        if not torch.cuda.is_available():
            configure_cpu(workdir)
        set_defaults({"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_LOGGING_STREAM": "ext://sys.stderr"})
        from vllm import LLM

        self.llm = LLM(
            model=str(model_path), skip_tokenizer_init=True, seed=seed, dtype=dtype, max_model_len=max_model_len,
            enforce_eager=True, enable_prefix_caching=True, gpu_memory_utilization=gpu_memory_utilization,
            enable_lora=True, max_lora_rank=self.max_lora_rank, max_loras=max_adapters, max_cpu_loras=max_adapters,
        )
        self.engine = self.llm.llm_engine
        self.adapters: dict[str, object] = {}  # name -> its LoRARequest
        self._ids = itertools.count(1)

    def load_adapter(self, name: str, directory: pathlib.Path) -> None:
        """Add the peft adapter in `directory` to vLLM as `name`. Raises ValueError when its rank
        is above `max_lora_rank` or vLLM does not take it."""
        from vllm.lora.request import LoRARequest

        rank = int(read_adapter_config(directory)["r"])
        if rank > self.max_lora_rank:
            raise ValueError(f"its rank {rank} is above the {self.max_lora_rank} this server was started for")
        request = LoRARequest(name, next(self._ids), str(directory))
        try:
            added = self.engine.add_lora(request)
        except (ValueError, RuntimeError, KeyError, OSError) as error:
            raise ValueError(f"vLLM did not take it: {str(error)[:300]}") from None
        if not added:
            raise ValueError("vLLM did not take it")
        self.adapters[name] = request

    def unload_adapter(self, name: str) -> None:
        """Remove the adapter `name` from vLLM."""
        request = self.adapters.pop(name, None)
        if request is not None:
            self.engine.remove_lora(request.lora_int_id)

    def tokens(
        self, prompt_ids: list[int], *, adapter: str | None, max_tokens: int, temperature: float, top_p: float, seed: int,
    ) -> Iterator[int]:
        """Yield up to `max_tokens` sampled token ids as vLLM samples them, a stop token last when one is sampled."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=1, temperature=temperature, top_p=top_p, top_k=0, max_tokens=max_tokens, seed=seed % (1 << 63),
            stop_token_ids=sorted(self.stop_token_ids), detokenize=False, skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
        )
        request_id = uuid.uuid4().hex
        self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                lora_request=self.adapters.get(adapter) if adapter else None)
        finished = False
        try:
            while not finished:
                for output in self.engine.step():
                    if output.request_id != request_id:
                        continue
                    yield from output.outputs[0].token_ids
                    finished = output.finished
        finally:
            if not finished:  # the caller stopped reading (a client gone): free the request's slot
                self.engine.abort_request([request_id])

    def close(self) -> None:
        """Stop vLLM's engine."""
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
