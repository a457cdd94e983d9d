"""OpenAI's chat and text completion protocol as the serving role speaks it (engine/serving.py):
request bodies checked into a `CompletionRequest`, and the answers and stream chunks built back.

Shapes follow OpenAI's API reference (https://platform.openai.com/docs/api-reference/chat,
https://platform.openai.com/docs/api-reference/completions): a non-streamed answer is one
`chat.completion` / `text_completion` object; a streamed one is server-sent events, one
`data: <chunk>` line per event and `data: [DONE]` last. A chat stream opens each choice with a
delta `{"role": "assistant", "content": ""}`, sends the content as deltas, closes the choice with
an empty delta and its `finish_reason`, and, when `stream_options.include_usage` is set, ends with
a chunk of no choices carrying `usage` (every other chunk then has `"usage": null`). With
`stream_options.continuous_usage_stats` (vLLM's extension) every chunk carries the usage so far.

Bad input raises `ProtocolError` (HTTP status, OpenAI `code`, the offending `param`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Most choices one request may ask for (`n`).
MAX_CHOICES = 8
#: Most stop strings (`stop`), as OpenAI allows.
MAX_STOP = 4
#: Keys either kind of request may carry; any other key is refused as OpenAI refuses it.
_COMMON_KEYS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "stream_options", "user",
    "presence_penalty", "frequency_penalty", "logprobs",
})
CHAT_KEYS = _COMMON_KEYS | {"messages", "max_completion_tokens", "metadata", "store", "top_logprobs"}
COMPLETION_KEYS = _COMMON_KEYS | {"prompt", "echo", "best_of", "suffix"}
_ROLES = ("system", "developer", "user", "assistant")


class ProtocolError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `code`, the offending `param`."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value", status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status

    def body(self) -> dict:
        """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    """How to sample: `max_tokens` (None: up to the context), `temperature` (0 is greedy),
    `top_p` (nucleus mass, 1 keeps every token), `n` choices, `stop` strings, `seed` (None: random)."""

    max_tokens: int | None
    temperature: float
    top_p: float
    n: int
    stop: tuple[str, ...]
    seed: int | None


@dataclass(frozen=True)
class CompletionRequest:
    """A checked request: `chat` (messages) or not (a text `prompt`), the `model` it names, how to
    sample, and how to answer (`stream`, with usage at the end or on every chunk)."""

    chat: bool
    model: str
    sampling: Sampling
    stream: bool
    include_usage: bool
    continuous_usage: bool
    messages: tuple[dict, ...] = ()
    prompt: str | tuple[int, ...] = ""


def _number(body: dict, name: str, default: float, *, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ProtocolError(f"{name} must be a number from {low} to {high}", param=name)
    return float(value)


def _integer(body: dict, name: str, *, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(f"{name} must be an integer from {low} to {high}", param=name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise ProtocolError(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", param="stop")
    return tuple(stops)


def _sampling(body: dict, *, chat: bool) -> Sampling:
    max_tokens = _integer(body, "max_tokens", low=1, high=1 << 20)
    if chat and max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", low=1, high=1 << 20)
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, low=-2.0, high=2.0) != 0.0:
            raise ProtocolError(f"{name} is not supported here; leave it 0", param=name, code="unsupported_value")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise ProtocolError("logprobs are not returned by this server", param="logprobs", code="unsupported_value")
    top_p = _number(body, "top_p", 1.0, low=0.0, high=1.0)
    if top_p == 0.0:
        raise ProtocolError("top_p must be above 0", param="top_p")
    return Sampling(
        max_tokens=max_tokens, temperature=_number(body, "temperature", 1.0, low=0.0, high=2.0), top_p=top_p,
        n=_integer(body, "n", low=1, high=MAX_CHOICES) or 1, stop=_stop(body.get("stop")),
        seed=_integer(body, "seed", low=-(1 << 63), high=(1 << 64) - 1),
    )


def _stream_options(body: dict) -> tuple[bool, bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ProtocolError("stream must be true or false", param="stream", code="invalid_type")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise ProtocolError("stream_options is only allowed with stream: true", param="stream_options")
    if not isinstance(options, dict) or not set(options) <= {"include_usage", "continuous_usage_stats", "include_obfuscation"}:
        raise ProtocolError("stream_options takes include_usage and continuous_usage_stats", param="stream_options")
    include, continuous = options.get("include_usage", False), options.get("continuous_usage_stats", False)
    if not isinstance(include, bool) or not isinstance(continuous, bool):
        raise ProtocolError("stream_options values must be true or false", param="stream_options", code="invalid_type")
    return stream, include, continuous


def _check_keys(body: Any, allowed: frozenset[str]) -> dict:
    if not isinstance(body, dict):
        raise ProtocolError("the body must be a JSON object", code="invalid_json")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ProtocolError(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0], code="unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("model is required", param="model", code="missing" if model is None else "invalid_type")
    return body


def _content(message: dict, index: int) -> str:
    """The text of a message: a string, or the text parts of a list of content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content):
        return "".join(part["text"] for part in content)
    raise ProtocolError(f"messages.{index}.content must be a string or a list of text parts", param=f"messages.{index}.content")


def parse_chat(body: Any) -> CompletionRequest:
    """Check a `POST /v1/chat/completions` body; raise ProtocolError naming the first bad field."""
    body = _check_keys(body, CHAT_KEYS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages must be a non-empty list", param="messages", code="invalid_type")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ProtocolError(f"messages.{index}.role must be one of {', '.join(_ROLES)}", param=f"messages.{index}.role")
        role = "system" if message["role"] == "developer" else message["role"]
        checked.append({"role": role, "content": _content(message, index)})
    stream, include_usage, continuous = _stream_options(body)
    return CompletionRequest(
        chat=True, model=body["model"], sampling=_sampling(body, chat=True), stream=stream,
        include_usage=include_usage, continuous_usage=continuous, messages=tuple(checked),
    )


def parse_completion(body: Any) -> CompletionRequest:
    """Check a `POST /v1/completions` body (`prompt`: a string, or a list of token ids); raise
    ProtocolError naming the first bad field."""
    body = _check_keys(body, COMPLETION_KEYS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise ProtocolError("prompt must be a non-empty string (or a list of token ids)", param="prompt")
    if body.get("echo") or body.get("suffix") or body.get("best_of") not in (None, 1):
        name = "echo" if body.get("echo") else "suffix" if body.get("suffix") else "best_of"
        raise ProtocolError(f"{name} is not supported here", param=name, code="unsupported_value")
    stream, include_usage, continuous = _stream_options(body)
    return CompletionRequest(
        chat=False, model=body["model"], sampling=_sampling(body, chat=False), stream=stream,
        include_usage=include_usage, continuous_usage=continuous, prompt=prompt,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class Choice:
    """One choice as sampled: its text, why it ended (`stop` or `length`) and its tokens."""

    text: str = ""
    finish_reason: str | None = None
    tokens: int = 0


def answer(request: CompletionRequest, *, answer_id: str, created: int, choices: list[Choice], prompt_tokens: int) -> dict:
    """The whole answer of a non-streamed request: a `chat.completion` or a `text_completion`."""
    if request.chat:
        items = [
            {"index": index, "message": {"role": "assistant", "content": choice.text}, "logprobs": None, "finish_reason": choice.finish_reason}
            for index, choice in enumerate(choices)
        ]
    else:
        items = [{"index": index, "text": choice.text, "logprobs": None, "finish_reason": choice.finish_reason} for index, choice in enumerate(choices)]
    return {
        "id": answer_id, "object": "chat.completion" if request.chat else "text_completion", "created": created,
        "model": request.model, "choices": items, "usage": usage(prompt_tokens, sum(choice.tokens for choice in choices)),
    }


def chunk(
    request: CompletionRequest, *, answer_id: str, created: int, index: int | None, text: str | None = None,
    role: bool = False, finish_reason: str | None = None, usage_so_far: dict | None = None,
) -> dict:
    """One stream chunk: choice `index` with its `text` delta (`role`: the chat choice's first
    chunk) or its `finish_reason`; `index` None: the closing chunk of no choices with `usage_so_far`."""
    body: dict[str, Any] = {"id": answer_id, "object": "chat.completion.chunk" if request.chat else "text_completion", "created": created, "model": request.model}
    if index is None:
        body["choices"] = []
    elif request.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {} if text is None else {"content": text}
        body["choices"] = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        body["choices"] = [{"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
    if request.include_usage or request.continuous_usage:
        body["usage"] = usage_so_far if (index is None or request.continuous_usage) else None
    return body
