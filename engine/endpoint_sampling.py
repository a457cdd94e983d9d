"""An evaluation sampled through an OpenAI-compatible endpoint (`[eval.endpoint]`, written by Lab
for an evaluation of an endpoint or a deployment: docs/evaluations.md).

Each rollout is one `POST {base_url}/chat/completions` with `{"model", "messages", "n": 1,
"max_tokens", "temperature", "seed", ...extra_body}` (OpenAI's chat completions format),
answering `{"choices": [{"message": {"content"}, "finish_reason"}], "usage": {"prompt_tokens",
"completion_tokens"}}`. The prompt is the example's chat messages as they are (the endpoint
applies its own chat template), and the tokens a sample reports are the endpoint's `usage`
(0 where it gives none). The API key is the job secret `api_key_var` names, sent as
`Authorization: Bearer ...`; secrets reach the engine as environment variables and are never
logged. Lab's own deployments answer so at `<lab>/api/v1/openai/v1`.

Errors: `EndpointRefused` when the endpoint refuses the request (4xx other than 429, a missing
secret): a configuration error, exit 2. `EndpointUnavailable` when it cannot be reached or keeps
failing (network errors, 429, 5xx) after retries, or answers without a completion: a crash that
Lab retries as a new attempt (the samples stored so far are kept once).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from labsdk.spec.secrets import header_value_sendable

from engine.chat_endpoint import ChatEndpoint
from engine.config import environment


class EndpointRefused(Exception):
    """The endpoint refused the evaluation's request (bad key, unknown model, bad body)."""


class EndpointUnavailable(Exception):
    """The endpoint could not be reached, kept failing after every retry, or answered no completion."""


@dataclass(frozen=True)
class EndpointCompletion:
    """One completion: its text, whether it was cut at `max_tokens` (`finish_reason` "length"),
    the endpoint's token counts and the request's wall-clock seconds."""

    text: str
    truncated: bool
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


class EndpointClient(ChatEndpoint):
    """Sample chat completions of one model on an OpenAI-compatible endpoint
    (engine.chat_endpoint), `api_key` sent as `Authorization: Bearer ...`."""

    refused = EndpointRefused
    unavailable = EndpointUnavailable

    def __init__(self, *, base_url: str, model: str, api_key: str, **kwargs) -> None:
        super().__init__(base_url=base_url, model=model, headers={"Authorization": f"Bearer {api_key}"}, **kwargs)

    @classmethod
    def from_spec(cls, endpoint, environ: Mapping[str, str] | None = None, **kwargs) -> EndpointClient:
        """Build the client of a spec's `[eval.endpoint]` (a `labsdk.spec.model.EvalEndpointConfig`),
        reading its key from `environ` (default the process environment). Raises EndpointRefused
        when the secret is not set or cannot be sent as a header value (RFC 9110 section 5.5)."""
        environ = environment() if environ is None else environ
        key = environ.get(endpoint.api_key_var)
        if not key:
            raise EndpointRefused(f"the endpoint needs the job secret {endpoint.api_key_var}, which this job was not given")
        if not header_value_sendable(key):
            raise EndpointRefused(f"the job secret {endpoint.api_key_var} cannot be sent as an HTTP header value")
        return cls(base_url=endpoint.base_url, model=endpoint.model, api_key=key, **kwargs)

    def complete(
        self, messages: list[dict], *, max_tokens: int, temperature: float, seed: int,
        extra_body: Mapping[str, object] | None = None,
    ) -> EndpointCompletion:
        """Return one completion of the chat `messages` (OpenAI chat messages); `extra_body` keys
        (`top_p`) are merged into the request body. Raises EndpointRefused or EndpointUnavailable."""
        body = {**(extra_body or {}), "model": self.model, "messages": messages, "n": 1,
                "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        started = time.perf_counter()
        answer = self.request("POST", "/chat/completions", body)
        latency = time.perf_counter() - started
        choices = answer.get("choices") if isinstance(answer, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if message is None or not isinstance(content, (str, type(None))):
            raise EndpointUnavailable(f"the endpoint {self.base_url} answered no completion")
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        return EndpointCompletion(
            text=content or "", truncated=choice.get("finish_reason") == "length",
            prompt_tokens=_count(usage.get("prompt_tokens")), completion_tokens=_count(usage.get("completion_tokens")),
            latency_s=latency,
        )


def _count(value: object) -> int:
    """A token count of `usage`, 0 when absent or not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
