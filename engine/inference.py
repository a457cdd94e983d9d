"""The engine's inference role: an HTTP server that samples from the current policy.

    python -m engine inference --model ID [--backend vllm|transformers] [--host H] [--port P] [--workdir DIR]

One model, one rollout backend (`engine.rollout.TransformersBackend` or
`engine.vllm_backend.VLLMBackend`), requests served one at a time (a lock; each request
is already a batch of `n` samples). Routes (docs/engine.md pins them):

- `GET /models`, `GET /v1/models`: `{"object": "list", "data": [{"id", "object": "model",
  "created", "owned_by": "lab", "max_model_len", "policy_version"}]}` — vLLM's model card
  with its `max_model_len` extension, which verifiers' train client (renderers 0.1.12
  `renderers.client._resolve_max_prompt_len`) reads before generating.
- `POST /inference/v1/generate`: token in, token out, as vLLM serves it and renderers'
  `generate()` calls it: `{"model", "token_ids": [int], "sampling_params": {"max_tokens",
  "temperature", "n", "seed", "stop_token_ids", "logprobs", "skip_special_tokens", ...}}` →
  `{"request_id", "model", "policy_version", "prompt_token_ids", "choices": [{"index",
  "token_ids", "logprobs": {"content": [{"token": "token_id:<id>", "logprob"}]},
  "finish_reason": "stop"|"length"}]}`.
- `POST /v1/completions` and `POST /v1/chat/completions`: OpenAI-compatible, with
  `logprobs` (completions: an integer, answered as `tokens`/`token_logprobs`; chat: a
  boolean, answered as `logprobs.content`), and token ids: `prompt_token_ids` on the
  answer and `token_ids` on each choice (vLLM's `return_token_ids` fields, always given).
- `POST /update_weights`: `{"weights_path": DIR, "policy_version": int}`: load every
  `*.safetensors` file in DIR (Hugging Face names; for LoRA the merged weights) into the
  backend, or, when DIR is a peft adapter directory (`adapter_config.json`,
  `adapter_model.safetensors`), apply that LoRA adapter (the vLLM backend's `load_adapter`);
  completions sampled afterwards carry that version. → `{"policy_version"}`.
- `GET /health`: `{"status": "ok", "policy_version", "backend", "weights"}`; `weights` is
  what the role takes of a LoRA policy best: "lora" (its adapter: vLLM started with
  `--max-lora-rank`) or "merged".

Bad input is a 400 (404 for an unknown model or route, 413 for a body over 1 MB) with
OpenAI's error body `{"error": {"message", "type": "invalid_request_error", "param",
"code"}}`, and changes nothing.
"""

from __future__ import annotations

import json
import logging
import pathlib
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from safetensors.torch import load_file

from engine.models import context_length, huggingface_dir, load_model
from engine.models import stop_token_ids as model_stop_token_ids
from engine.policy import is_adapter_dir, read_adapter_config
from engine.rollout import TransformersBackend
from engine.vllm_backend import VLLMBackend

logger = logging.getLogger("engine")

MAX_BODY_BYTES = 1 << 20
MAX_SAMPLES = 64


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `code`, the offending `param`."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value", status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


@dataclass
class Sampling:
    """Validated sampling settings of one request."""

    max_tokens: int
    temperature: float
    n: int
    seed: int
    stop_token_ids: list[int] | None
    logprobs: bool


def _integer(body: dict, name: str, default: int | None, *, minimum: int, maximum: int, param: str) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{param} must be an integer", param=param, code="invalid_type")
    if not minimum <= value <= maximum:
        raise RequestError(f"{param} must be between {minimum} and {maximum}", param=param)
    return value


def _token_ids(value: Any, *, param: str, vocab_size: int, allow_empty: bool = False) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise RequestError(f"{param} must be a list of token ids", param=param, code="invalid_type")
    if not value and not allow_empty:
        raise RequestError(f"{param} must not be empty", param=param)
    for index, token in enumerate(value):
        if not 0 <= token < vocab_size:
            raise RequestError(f"{param}.{index}: token id {token} is outside the vocabulary (0..{vocab_size - 1})", param=f"{param}.{index}")
    return value


@dataclass
class InferenceServer:
    """Serve one model through one rollout backend over HTTP (routes in the module docstring).

    `backend`: a RolloutBackend; `tokenizer`: the model's Hugging Face tokenizer (chat
    template and text); `model_id`: the catalogue id clients name; `max_model_len`: prompt
    plus completion tokens per sequence; `backend_name`: "transformers" or "vllm";
    `stop_token_ids`: the model's stop tokens, used when a request names none.
    """

    backend: Any
    tokenizer: Any
    model_id: str
    max_model_len: int
    backend_name: str
    stop_token_ids: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def policy_version(self) -> int:
        return int(getattr(self.backend, "policy_version", 0))

    # ---- routes ----

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, dict]:
        """Answer one request: (HTTP status, JSON body). Raises RequestError for bad input."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        routes = {
            ("GET", "/models"): self.models,
            ("GET", "/v1/models"): self.models,
            ("GET", "/health"): self.health,
            ("POST", "/inference/v1/generate"): self.generate_tokens,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/update_weights"): self.update_weights,
        }
        route = routes.get((method, path))
        if route is None:
            known = {p for _, p in routes}
            if path in known:
                raise RequestError(f"{method} is not allowed on {path}", code="method_not_allowed", status=405)
            raise RequestError(f"no route {path}", code="not_found", status=404)
        if method == "GET":
            return 200, route()
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object", code="invalid_json")
        return 200, route(body)

    def models(self) -> dict:
        card = {
            "id": self.model_id, "object": "model", "created": self.created, "owned_by": "lab",
            "root": self.model_id, "max_model_len": self.max_model_len, "policy_version": self.policy_version,
        }
        return {"object": "list", "data": [card]}

    def health(self) -> dict:
        weights = getattr(self.backend, "weights_format", "merged")
        return {"status": "ok", "policy_version": self.policy_version, "backend": self.backend_name, "weights": weights}

    def generate_tokens(self, body: dict) -> dict:
        self._check_model(body)
        prompt = _token_ids(body.get("token_ids"), param="token_ids", vocab_size=self._vocab_size())
        params = body.get("sampling_params", {})
        if not isinstance(params, dict):
            raise RequestError("sampling_params must be an object", param="sampling_params", code="invalid_type")
        sampling = self._sampling(params, prompt_length=len(prompt), prefix="sampling_params.", logprobs_default=1)
        completions, version = self._sample(prompt, sampling)
        return {
            "request_id": f"gen-{uuid.uuid4().hex}",
            "model": self.model_id,
            "policy_version": version,
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": index,
                    "token_ids": completion.token_ids,
                    "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(completion.token_ids, completion.logprobs)]}
                    if sampling.logprobs else None,
                    "finish_reason": "length" if completion.truncated else "stop",
                }
                for index, completion in enumerate(completions)
            ],
        }

    def completions(self, body: dict) -> dict:
        self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt must not be empty", param="prompt")
            prompt_ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        else:
            prompt_ids = _token_ids(prompt, param="prompt", vocab_size=self._vocab_size())
        logprobs = _integer(body, "logprobs", None, minimum=0, maximum=1, param="logprobs")
        sampling = self._sampling({**body, "logprobs": logprobs is not None}, prompt_length=len(prompt_ids), prefix="", logprobs_default=0)
        completions, version = self._sample(prompt_ids, sampling)
        choices = []
        for index, completion in enumerate(completions):
            choice = {
                "index": index,
                "text": self._text(completion.token_ids),
                "token_ids": completion.token_ids,
                "logprobs": None,
                "finish_reason": "length" if completion.truncated else "stop",
            }
            if sampling.logprobs:
                choice["logprobs"] = {
                    "tokens": [self.tokenizer.convert_ids_to_tokens(t) for t in completion.token_ids],
                    "token_logprobs": completion.logprobs,
                    "top_logprobs": None,
                    "text_offset": None,
                }
            choices.append(choice)
        return self._envelope("text_completion", "cmpl", prompt_ids, completions, choices, version)

    def chat_completions(self, body: dict) -> dict:
        self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages", code="invalid_type")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant") or not isinstance(message.get("content"), str):
                raise RequestError(
                    f"messages.{index} must be an object with role system, user or assistant and string content", param=f"messages.{index}"
                )
        logprobs = body.get("logprobs", False)
        if not isinstance(logprobs, bool):
            raise RequestError("logprobs must be a boolean", param="logprobs", code="invalid_type")
        if "max_completion_tokens" in body and "max_tokens" not in body:
            body = {**body, "max_tokens": body["max_completion_tokens"]}
        prompt_ids = list(self.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages], add_generation_prompt=True, tokenize=True, return_dict=False
        ))
        sampling = self._sampling({**body, "logprobs": logprobs}, prompt_length=len(prompt_ids), prefix="", logprobs_default=0)
        completions, version = self._sample(prompt_ids, sampling)
        stop_ids = set(self._stop_token_ids(sampling))
        choices = []
        for index, completion in enumerate(completions):
            content_ids = [t for t in completion.token_ids if t not in stop_ids]
            choices.append({
                "index": index,
                "message": {"role": "assistant", "content": self._text(content_ids)},
                "token_ids": completion.token_ids,
                "logprobs": {
                    "content": [
                        {"token": self.tokenizer.convert_ids_to_tokens(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(completion.token_ids, completion.logprobs)
                    ]
                } if sampling.logprobs else None,
                "finish_reason": "length" if completion.truncated else "stop",
            })
        return self._envelope("chat.completion", "chatcmpl", prompt_ids, completions, choices, version)

    def update_weights(self, body: dict) -> dict:
        path = body.get("weights_path")
        version = _integer(body, "policy_version", None, minimum=0, maximum=1 << 40, param="policy_version")
        if not isinstance(path, str) or not path:
            raise RequestError("weights_path must be a directory path", param="weights_path", code="invalid_type")
        if version is None:
            raise RequestError("policy_version is required", param="policy_version", code="missing")
        restart = body.get("restart", False)
        if not isinstance(restart, bool):
            raise RequestError("restart must be true or false", param="restart", code="invalid_type")
        directory = pathlib.Path(path)
        if directory.is_dir() and is_adapter_dir(directory):
            return self._update_adapter(directory, version, restart)
        files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
        if not files:
            raise RequestError(f"{path} holds no .safetensors files", param="weights_path")
        tensors = {}
        for file in files:
            try:
                tensors.update(load_file(str(file)))
            except Exception as error:  # a truncated or foreign file is the caller's mistake
                raise RequestError(f"{file.name} is not a safetensors file: {error}", param="weights_path") from None
        with self.lock:
            self._check_version(version, restart)
            try:
                self.backend.load_weights(tensors.items(), policy_version=version)
            except KeyError as error:
                raise RequestError(f"unknown weight {error}", param="weights_path") from None
            except RuntimeError as error:  # a shape that does not fit
                raise RequestError(f"weights do not fit the model: {str(error)[:300]}", param="weights_path") from None
        logger.info("loaded policy version %d from %s (%d tensors)", version, path, len(tensors))
        return {"policy_version": self.policy_version}

    def _update_adapter(self, directory: pathlib.Path, version: int, restart: bool) -> dict:
        """Apply the peft adapter in `directory` as policy `version` (`update_weights`)."""
        load_adapter = getattr(self.backend, "load_adapter", None)
        if load_adapter is None:
            raise RequestError(f"the {self.backend_name} backend takes merged weights, not a LoRA adapter", param="weights_path")
        try:
            rank = read_adapter_config(directory)["r"]
        except ValueError as error:
            raise RequestError(str(error)[:300], param="weights_path") from None
        with self.lock:
            self._check_version(version, restart)
            try:
                load_adapter(directory, policy_version=version)
            except (ValueError, KeyError) as error:
                raise RequestError(f"the adapter does not fit the model: {str(error)[:300]}", param="weights_path") from None
        logger.info("loaded policy version %d from %s (LoRA adapter, rank %d)", version, directory, rank)
        return {"policy_version": self.policy_version}

    def _check_version(self, version: int, restart: bool) -> None:
        if version < self.policy_version and not restart:  # restart: a new trainer session starts over
            raise RequestError(
                f"policy_version {version} is older than the loaded {self.policy_version}", param="policy_version", code="stale_policy_version",
                status=409,
            )

    # ---- helpers ----

    def _check_model(self, body: dict) -> None:
        model = body.get("model", self.model_id)
        if model != self.model_id:
            raise RequestError(f"model {model!r} is not served here; this server serves {self.model_id!r}", param="model", code="model_not_found", status=404)

    def _vocab_size(self) -> int:
        return len(self.tokenizer)

    def _sampling(self, params: dict, *, prompt_length: int, prefix: str, logprobs_default: int) -> Sampling:
        room = self.max_model_len - prompt_length
        if room < 1:
            raise RequestError(f"the prompt has {prompt_length} tokens; this model's context is {self.max_model_len}", param=f"{prefix}token_ids" if prefix else "prompt")
        max_tokens = _integer(params, "max_tokens", min(16, room), minimum=1, maximum=room, param=f"{prefix}max_tokens")
        temperature = params.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 10:
            raise RequestError(f"{prefix}temperature must be a number from 0 to 10", param=f"{prefix}temperature")
        for name in ("top_p",):
            if name in params and params[name] not in (None, 1, 1.0):
                raise RequestError(f"{prefix}{name} other than 1 is not supported (rollouts sample the full distribution)", param=f"{prefix}{name}")
        if params.get("top_k") not in (None, 0, -1):
            raise RequestError(f"{prefix}top_k is not supported (rollouts sample the full distribution)", param=f"{prefix}top_k")
        n = _integer(params, "n", 1, minimum=1, maximum=MAX_SAMPLES, param=f"{prefix}n")
        seed = _integer(params, "seed", None, minimum=0, maximum=(1 << 63) - 1, param=f"{prefix}seed")
        stop = params.get("stop_token_ids")
        stop_ids = None if stop is None else _token_ids(stop, param=f"{prefix}stop_token_ids", vocab_size=self._vocab_size(), allow_empty=True)
        logprobs = params.get("logprobs", logprobs_default)
        if isinstance(logprobs, bool):
            wanted = logprobs
        elif isinstance(logprobs, int) and 0 <= logprobs <= 1:
            wanted = True
        elif logprobs is None:
            wanted = False
        else:
            raise RequestError(f"{prefix}logprobs: only the sampled token's log-probability is returned (0 or 1)", param=f"{prefix}logprobs")
        return Sampling(
            max_tokens=max_tokens, temperature=float(temperature), n=n,
            seed=seed if seed is not None else random.SystemRandom().randrange(1 << 31), stop_token_ids=stop_ids, logprobs=wanted,
        )

    def _stop_token_ids(self, sampling: Sampling) -> list[int]:
        return self.stop_token_ids if sampling.stop_token_ids is None else sampling.stop_token_ids

    def _sample(self, prompt: list[int], sampling: Sampling):
        with self.lock:
            completions = self.backend.generate(
                [prompt], n=sampling.n, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                seed=sampling.seed, stop_token_ids=self._stop_token_ids(sampling),
            )
            return completions, self.policy_version

    def _text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _envelope(self, kind: str, prefix: str, prompt_ids, completions, choices, version) -> dict:
        completion_tokens = sum(len(c.token_ids) for c in completions)
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": self.model_id,
            "policy_version": version, "prompt_token_ids": prompt_ids, "choices": choices,
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens, "total_tokens": len(prompt_ids) + completion_tokens},
        }

    # ---- HTTP ----

    def http_server(self, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
        """Return a ThreadingHTTPServer bound to (host, port) answering through `handle`."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self, method: str) -> None:
                body = None
                try:
                    if method == "POST":
                        try:
                            length = int(self.headers.get("Content-Length") or 0)
                        except ValueError:
                            raise RequestError("Content-Length must be an integer", code="invalid_request") from None
                        if length > MAX_BODY_BYTES or length < 0:
                            self.close_connection = True
                            # Read (and drop) what a client is still sending, so it sees the answer.
                            remaining = min(max(length, 0), 16 * MAX_BODY_BYTES)
                            while remaining > 0:
                                chunk = self.rfile.read(min(remaining, 1 << 16))
                                if not chunk:
                                    break
                                remaining -= len(chunk)
                            raise RequestError(f"the body is over {MAX_BODY_BYTES} bytes", code="request_too_large", status=413)
                        raw = self.rfile.read(length)
                        try:
                            body = json.loads(raw or b"null")
                        except (ValueError, UnicodeDecodeError):
                            raise RequestError("the body is not valid JSON", code="invalid_json") from None
                    status, answer = server.handle(method, self.path, body)
                except RequestError as error:
                    status = error.status
                    answer = {"error": {"message": str(error), "type": "invalid_request_error", "param": error.param, "code": error.code}}
                except Exception as error:  # the backend failed: say so, keep serving
                    logger.exception("inference request failed")
                    status = 500
                    answer = {"error": {"message": f"inference failed: {type(error).__name__}", "type": "server_error", "param": None, "code": "internal_error"}}
                self._answer(status, answer)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def log_message(self, *args):
                pass

        return ThreadingHTTPServer((host, port), Handler)


def build_server(
    model_id: str, *, backend_name: str, workdir: pathlib.Path, model_dir: pathlib.Path | None = None,
    vllm_dtype: str = "bfloat16", seed: int = 0, tensor_parallel_size: int = 1, max_lora_rank: int = 0,
) -> InferenceServer:
    """Load `model_id` from the model cache and start its backend; return the server (not yet listening).

    The transformers backend samples fp32 weights on this process's torch threads; the vLLM
    backend starts vLLM on the model's Hugging Face directory (engine.vllm_backend), split over
    `tensor_parallel_size` GPUs, with LoRA for adapters up to `max_lora_rank` when it is above 0.
    Raises engine.models.ModelNotFound for an unknown id.
    """
    model, tokenizer = load_model(model_id, model_dir)
    stop_token_ids = model_stop_token_ids(model, tokenizer)
    max_model_len = context_length(model)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if backend_name == "vllm":
        path = huggingface_dir(model_id, model, model_dir, workdir)
        backend = VLLMBackend(path, seed=seed, max_model_len=max_model_len, stop_token_ids=stop_token_ids, workdir=workdir,
                              dtype=vllm_dtype, tensor_parallel_size=tensor_parallel_size, max_lora_rank=max_lora_rank)
        del model
    else:
        backend = TransformersBackend(model, pad_token_id=tokenizer.pad_token_id, stop_token_ids=stop_token_ids)
    return InferenceServer(
        backend=backend, tokenizer=tokenizer, model_id=model_id, max_model_len=max_model_len,
        backend_name=backend_name, stop_token_ids=stop_token_ids,
    )
