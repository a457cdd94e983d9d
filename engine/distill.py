"""Distillation from a teacher endpoint (`loss = "sft"`, Prime's hosted-training SFT).

Each step the engine takes the step's prompts from the training environments (the same
examples a GRPO step would take: `batch_size / rollouts_per_example` prompts), asks the
teacher for `rollouts_per_example` completions of each (an `[[env]]` block's `group_size`
where it sets one), and trains the policy on the
teacher's tokens with the supervised loss: the mean negative log-likelihood per completion
token (token-level cross-entropy over the whole batch, as in prime-rl's SFT trainer).

The teacher is any OpenAI-compatible chat-completions endpoint (`[teacher.client]
base_url`, Prime Inference when the spec names none): `POST {base_url}/chat/completions`
with `{"model", "messages", "n", "max_tokens", "temperature", "seed", ...extra_body}`,
answering `{"choices": [{"message": {"content"}, "finish_reason"}]}` (OpenAI's chat
completions format). Its API key is the job secret named by `api_key_var` and its extra
headers the secrets named in `headers_from_env`; secrets reach the engine as environment
variables and are never logged. The teacher's text is re-tokenized with the policy's
tokenizer (teacher and student need not share a vocabulary), and a completion the teacher
finished (`finish_reason = "stop"`) ends with the policy's end-of-turn token, so the student
also learns to stop.

The teacher's completions are scored by the environments as rollouts are, so `reward/mean`
of an SFT step is the teacher's reward on that batch; the student's own progress shows in
`eval/<env>/mean`.

Errors: `TeacherRefused` when the endpoint refuses the job's request (4xx other than 429, an
unknown model, a missing secret): a configuration error, exit 2. `TeacherUnavailable` when
it cannot be reached or keeps failing (network errors, 429, 5xx) after retries: a crash
that Lab retries as a new attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from labsdk.spec.secrets import header_value_sendable

from engine.chat_endpoint import ChatEndpoint
from engine.config import environment

logger = logging.getLogger("engine")

class TeacherRefused(Exception):
    """The teacher endpoint refused the job's request (bad key, unknown model, bad body)."""


class TeacherUnavailable(Exception):
    """The teacher endpoint could not be reached or kept failing after every retry."""


@dataclass(frozen=True)
class TeacherCompletion:
    """One completion of the teacher: its text and whether it ended on its own (not cut at max_tokens)."""

    text: str
    finished: bool


class TeacherClient(ChatEndpoint):
    """Sample completions from one teacher model on an OpenAI-compatible endpoint
    (engine.chat_endpoint: `/chat/completions` and `/models` are asked)."""

    refused = TeacherRefused
    unavailable = TeacherUnavailable
    what = "teacher"

    @property
    def description(self) -> str:
        return "the teacher endpoint"

    @classmethod
    def from_spec(cls, teacher, environ: Mapping[str, str] | None = None, **kwargs) -> TeacherClient:
        """Build the client of a spec's `[teacher]` (a `labsdk.spec.TeacherConfig`), reading its
        secrets from `environ` (default the process environment).

        Raises TeacherRefused when a secret it names is not set, or cannot be sent as a header
        value (RFC 9110 section 5.5: visible ASCII, spaces and tabs; a line break, NUL or a
        non-ASCII character would fail every request as if the endpoint were down).
        """
        environ = environment() if environ is None else environ
        endpoint = teacher.endpoint()
        wanted = {"Authorization": endpoint.api_key_var, **endpoint.headers_from_env}
        missing = sorted({name for name in wanted.values() if not environ.get(name)})
        if missing:
            raise TeacherRefused(
                f"the teacher endpoint needs the job secret(s) {', '.join(missing)}, which this job was not given"
            )
        unsendable = sorted({name for name in wanted.values() if not header_value_sendable(environ[name])})
        if unsendable:
            raise TeacherRefused(
                f"the job secret(s) {', '.join(unsendable)} cannot be sent as HTTP header values "
                "(a line break, NUL, another control character or a non-ASCII character)"
            )
        headers = {header: environ[name] for header, name in wanted.items()}
        headers["Authorization"] = f"Bearer {headers['Authorization']}"
        return cls(base_url=endpoint.base_url, model=teacher.model, headers=headers, **kwargs)

    def check_model(self) -> None:
        """Ask the endpoint's `GET /models` whether it serves the teacher model.

        Raises TeacherRefused when it lists other models only, TeacherUnavailable when it
        cannot be asked.
        """
        answer = self.request("GET", "/models")
        data = answer.get("data") if isinstance(answer, dict) else None
        served = [card.get("id") for card in data if isinstance(card, dict)] if isinstance(data, list) else []
        if self.model not in served:
            raise TeacherRefused(
                f"the teacher endpoint {self.base_url} does not serve {self.model!r} (it lists {', '.join(map(str, served)) or 'none'}); "
                "fix [teacher] model, or set [teacher.client] skip_model_check = true"
            )

    def complete(
        self, messages: list[dict], *, n: int, max_tokens: int, temperature: float, seed: int,
        extra_body: Mapping[str, object] | None = None,
    ) -> list[TeacherCompletion]:
        """Return `n` completions of the chat `messages` (OpenAI chat messages).

        `max_tokens` is counted in the teacher's tokens; `extra_body` keys are merged into the
        request body as given (e.g. `chat_template_kwargs`, `top_p`). Raises TeacherRefused
        or TeacherUnavailable (module docstring); an answer without `n` usable choices is
        TeacherUnavailable too.
        """
        body = {**(extra_body or {}), "model": self.model, "messages": messages, "n": n,
                "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
        answer = self.request("POST", "/chat/completions", body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        completions = []
        for choice in choices if isinstance(choices, list) else []:
            message = choice.get("message") if isinstance(choice, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                completions.append(TeacherCompletion(text=content, finished=choice.get("finish_reason") == "stop"))
        if len(completions) != n:
            raise TeacherUnavailable(f"the teacher endpoint answered {len(completions)} usable completions, {n} were asked for")
        return completions


def teacher_token_ids(tokenizer, completion: TeacherCompletion, *, end_token_id: int, max_tokens: int) -> list[int]:
    """Tokenize a teacher completion with the policy's tokenizer for training.

    Returns at most `max_tokens` ids: the text's tokens (no special tokens added), then
    `end_token_id` when the teacher finished on its own and there is room.
    """
    ids = list(tokenizer(completion.text, add_special_tokens=False)["input_ids"])[:max_tokens]
    if completion.finished and len(ids) < max_tokens:
        ids.append(end_token_id)
    return ids
