"""The engine's serving role: one base model (or one full fine-tuned checkpoint) and the LoRA
adapters registered on it, behind an OpenAI-compatible HTTP API that streams.

    python -m engine serve --model ID [--weights DIR] [--served-model NAME] [--backend transformers]
                           [--host H] [--port P] [--address-file FILE] [--max-adapters N]

Lab's deployments (serving/) run one such server per base model, shared by every adapter of that
base, and one per full checkpoint (docs/serving.md). Routes:

- `GET /health` (no token): `{"status": "ok", "model", "backend", "max_model_len", "adapters":
  {"registered": [names], "resident": [names, least recently used first], "max_resident"}}`.
- `GET /v1/models`: OpenAI's model list: the served model and every registered adapter.
- `POST /v1/adapters` `{"name", "path", "load": true}`: register the peft LoRA adapter in the
  directory `path` (`adapter_config.json` and `adapter_model.safetensors`; pickled weights are
  refused) under `name`, and load it now unless `load` is false → `{"name", "resident"}`.
- `DELETE /v1/adapters/{name}`: unload and forget it → `{"name", "deleted": true}`.
- `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI's, streamed or not
  (engine/serving_protocol.py); `model` is the served model's name or a registered adapter's.

At most `max_adapters` adapters are loaded at once: a request for one that is registered but not
loaded loads it, unloading the least recently used first (`AdapterSlots`). Requests are served
one at a time (a lock held from the first token to the last), as the inference role does.

With `LAB_SERVING_TOKEN` set, every route but `/health` needs `Authorization: Bearer <token>`
(401 otherwise): the server listens on a port of the machine, and only Lab may use it. Errors
have OpenAI's body `{"error": {"message", "type", "param", "code"}}`; bad input changes nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
import pathlib
import random
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine.policy import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, read_adapter_config
from engine.serving_protocol import (
    Choice,
    CompletionRequest,
    ProtocolError,
    answer,
    chunk,
    parse_chat,
    parse_completion,
    usage,
)

logger = logging.getLogger("engine")

MAX_BODY_BYTES = 1 << 20
#: Adapters loaded at once unless `--max-adapters` says otherwise.
DEFAULT_MAX_ADAPTERS = 4


class AdapterSlots:
    """The adapters registered on a server (name → directory) and the at most `max_resident`
    of them loaded in the backend, kept in order of use: loading one more unloads the least
    recently used first."""

    def __init__(self, backend: Any, max_resident: int):
        self.backend = backend
        self.max_resident = max_resident
        self.registered: dict[str, pathlib.Path] = {}
        self.resident: OrderedDict[str, None] = OrderedDict()

    def register(self, name: str, directory: pathlib.Path, *, load: bool) -> None:
        """Register the adapter in `directory` as `name` (replacing one registered under that
        name from elsewhere) and load it when `load`. Raises ProtocolError for a directory that
        is not a peft LoRA adapter with safetensors weights, or one that does not fit."""
        if not (directory / ADAPTER_WEIGHTS_FILE).is_file():
            raise ProtocolError(f"{directory} holds no {ADAPTER_WEIGHTS_FILE}", param="path")
        try:
            read_adapter_config(directory)
        except ValueError as error:
            raise ProtocolError(str(error)[:300], param="path") from None
        if self.registered.get(name) not in (None, directory):
            self.remove(name)
        self.registered[name] = directory
        if load:
            try:
                self.use(name)
            except ProtocolError:
                del self.registered[name]
                raise

    def use(self, name: str) -> None:
        """Make the registered adapter `name` resident, and the most recently used."""
        if name in self.resident:
            self.resident.move_to_end(name)
            return
        while len(self.resident) >= self.max_resident:
            evicted, _ = self.resident.popitem(last=False)
            self.backend.unload_adapter(evicted)
            logger.info("unloaded adapter %s (least recently used)", evicted)
        try:
            self.backend.load_adapter(name, self.registered[name])
        except ValueError as error:
            raise ProtocolError(f"adapter {name}: {error}", param="model", code="adapter_load_failed") from None
        self.resident[name] = None
        logger.info("loaded adapter %s from %s", name, self.registered[name])

    def remove(self, name: str) -> bool:
        """Unload and forget the adapter `name`; return whether it was registered."""
        if name in self.resident:
            del self.resident[name]
            self.backend.unload_adapter(name)
        return self.registered.pop(name, None) is not None


class _TextStream:
    """The text of one choice as its tokens arrive: what is safe to send so far, and whether a
    stop string has ended it (the text is cut before the stop string, as OpenAI does)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.sent = ""
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, token: int) -> tuple[str, bool]:
        """Add a token; return (the text to send now, whether a stop string was reached)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        hits = [text.find(s) for s in self.stop if s in text]
        if hits:
            return self._advance(text[: min(hits)]), True
        end = len(text) - self.hold
        while end > len(self.sent) and text[end - 1] == "\ufffd":  # a character whose bytes are still to come
            end -= 1
        return self._advance(text[:end]), False

    def finish(self) -> str:
        """Return the text still held back once the choice has ended without a stop string."""
        return self._advance(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta


class _HeldStream:
    """Stream frames while holding the server's lock; `close` (or the end) releases it once."""

    def __init__(self, lock: threading.Lock, frames: Iterator[bytes]):
        self.lock, self.frames, self.held = lock, frames, True

    def __iter__(self) -> _HeldStream:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self.frames)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.frames.close()
        if self.held:
            self.held = False
            self.lock.release()


def _sse(body: dict | str) -> bytes:
    return b"data: " + (body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))).encode() + b"\n\n"


@dataclass
class ServingServer:
    """Serve `served_model` (and the adapters registered on it) through `backend` over HTTP
    (routes in the module docstring). `tokenizer`: the model's (chat template and text);
    `max_model_len`: prompt plus completion tokens per sequence; `token`: what callers must
    present (None: no check)."""

    backend: Any
    tokenizer: Any
    served_model: str
    max_model_len: int
    token: str | None = None
    max_adapters: int = DEFAULT_MAX_ADAPTERS
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.adapters = AdapterSlots(self.backend, self.max_adapters)

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header value presents this server's token."""
        if self.token is None:
            return True
        presented = (header or "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(presented.encode(), self.token.encode())

    def handle(self, method: str, path: str, body: Any) -> tuple[int, dict | _HeldStream]:
        """Answer one request: (HTTP status, a JSON body or a stream of SSE frames). Raises ProtocolError."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if method == "GET" and path == "/health":
            return 200, self.health()
        if method == "GET" and path in ("/v1/models", "/models"):
            return 200, self.models()
        if method == "POST" and path == "/v1/adapters":
            return 200, self.register_adapter(body)
        if method == "DELETE" and path.startswith("/v1/adapters/"):
            return 200, self.delete_adapter(path.removeprefix("/v1/adapters/"))
        if method == "POST" and path == "/v1/chat/completions":
            return 200, self.complete(parse_chat(body))
        if method == "POST" and path == "/v1/completions":
            return 200, self.complete(parse_completion(body))
        raise ProtocolError(f"no route {method} {path}", code="not_found", status=404)

    def health(self) -> dict:
        return {
            "status": "ok", "model": self.served_model, "backend": self.backend.name, "max_model_len": self.max_model_len,
            "adapters": {"registered": sorted(self.adapters.registered), "resident": list(self.adapters.resident), "max_resident": self.max_adapters},
        }

    def models(self) -> dict:
        names = [self.served_model, *sorted(self.adapters.registered)]
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "lab", "root": self.served_model,
             "parent": None if name == self.served_model else self.served_model, "max_model_len": self.max_model_len}
            for name in names
        ]}

    def register_adapter(self, body: Any) -> dict:
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"] or not isinstance(body.get("path"), str):
            raise ProtocolError("the body is {\"name\": str, \"path\": str, \"load\": bool}", param="name")
        name, load = body["name"], body.get("load", True)
        if name == self.served_model or "/" in name or not isinstance(load, bool):
            raise ProtocolError("name must differ from the served model's and hold no '/'; load is true or false", param="name")
        directory = pathlib.Path(body["path"])
        if not (directory / ADAPTER_CONFIG_FILE).is_file():
            raise ProtocolError(f"{directory} holds no {ADAPTER_CONFIG_FILE}", param="path")
        with self.lock:
            self.adapters.register(name, directory, load=load)
            return {"name": name, "resident": name in self.adapters.resident}

    def delete_adapter(self, name: str) -> dict:
        with self.lock:
            if not self.adapters.remove(name):
                raise ProtocolError(f"no adapter {name!r}", param="name", code="not_found", status=404)
        return {"name": name, "deleted": True}

    def _prompt_ids(self, request: CompletionRequest) -> list[int]:
        if request.chat:
            return list(self.tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=True, return_dict=False))
        if isinstance(request.prompt, tuple):
            vocabulary = len(self.tokenizer)
            if not all(0 <= token < vocabulary for token in request.prompt):
                raise ProtocolError(f"prompt token ids must be from 0 to {vocabulary - 1}", param="prompt")
            return list(request.prompt)
        return list(self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"])

    def complete(self, request: CompletionRequest) -> dict | _HeldStream:
        """Sample a request's choices: the whole answer, or (`stream`) its SSE frames."""
        if request.model != self.served_model and request.model not in self.adapters.registered:
            raise ProtocolError(f"The model `{request.model}` does not exist.", param="model", code="model_not_found", status=404)
        adapter = None if request.model == self.served_model else request.model
        prompt_ids = self._prompt_ids(request)
        room = self.max_model_len - len(prompt_ids)
        max_tokens = request.sampling.max_tokens or room
        if room < 1 or max_tokens > room:
            raise ProtocolError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has {len(prompt_ids)} "
                f"and {max_tokens} more were asked for.", param="max_tokens" if room >= 1 else "messages", code="context_length_exceeded",
            )
        answer_id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        seed = request.sampling.seed if request.sampling.seed is not None else random.SystemRandom().randrange(1 << 62)
        self.lock.acquire()
        try:
            if adapter is not None:
                self.adapters.use(adapter)
        except BaseException:
            self.lock.release()
            raise
        choices = self._choices(prompt_ids, adapter=adapter, request=request, max_tokens=max_tokens, seed=seed)
        if request.stream:
            return _HeldStream(self.lock, self._frames(request, choices, answer_id=answer_id, prompt_tokens=len(prompt_ids)))
        try:
            results: list[Choice] = []
            for index, delta, counted, finish_reason in choices:
                if index == len(results):
                    results.append(Choice())
                results[index].text += delta
                results[index].tokens += counted
                results[index].finish_reason = finish_reason
        finally:
            choices.close()
            self.lock.release()
        return answer(request, answer_id=answer_id, created=int(time.time()), choices=results, prompt_tokens=len(prompt_ids))

    def _choices(self, prompt_ids: list[int], *, adapter: str | None, request: CompletionRequest, max_tokens: int, seed: int):
        """Yield (choice index, text delta, True, None) per sampled token, then (index, the text
        held back, False, finish reason) when the choice ends, for each choice in turn."""
        sampling = request.sampling
        for index in range(sampling.n):
            text = _TextStream(self.tokenizer, sampling.stop)
            finish_reason, cut = "length", False
            for token in self.backend.tokens(
                prompt_ids, adapter=adapter, max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p, seed=seed + index,
            ):
                if token in self.backend.stop_token_ids:
                    yield index, "", True, None
                    finish_reason = "stop"
                    break
                delta, cut = text.push(token)
                yield index, delta, True, None
                if cut:
                    finish_reason = "stop"
                    break
            yield index, "" if cut else text.finish(), False, finish_reason

    def _frames(self, request: CompletionRequest, choices, *, answer_id: str, prompt_tokens: int) -> Iterator[bytes]:
        """The SSE frames of a streamed answer (module docstring of engine/serving_protocol.py)."""
        created, completion_tokens, opened = int(time.time()), 0, -1

        def frame(index: int | None, **fields: Any) -> bytes:
            return _sse(chunk(request, answer_id=answer_id, created=created, index=index,
                              usage_so_far=usage(prompt_tokens, completion_tokens), **fields))

        try:
            for index, delta, counted, finish_reason in choices:
                if request.chat and index > opened:
                    opened = index
                    yield frame(index, role=True)
                completion_tokens += counted
                if delta:
                    yield frame(index, text=delta)
                if finish_reason is not None:
                    yield frame(index, finish_reason=finish_reason)
        except Exception as error:  # the backend failed mid-stream: say so in the stream, as OpenAI does
            logger.exception("serving stream failed")
            yield _sse(ProtocolError(f"inference failed: {type(error).__name__}", code="internal_error", status=500).body())
            return
        finally:
            choices.close()
        if request.include_usage:
            yield frame(None)
        yield _sse("[DONE]")

    def http_server(self, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
        """Return a ThreadingHTTPServer bound to (host, port) answering through `handle`."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                # A stream is one small write per token: sent at once, not held for the last one's ACK (Nagle).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _json(self, status: int, answer: dict) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, frames: _HeldStream) -> None:
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Cache-Control", "no-cache")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for frame in frames:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):  # the caller went away: stop sampling
                    self.close_connection = True
                finally:
                    frames.close()

            def _body(self) -> Any:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    raise ProtocolError("Content-Length must be an integer", code="invalid_request") from None
                if length > MAX_BODY_BYTES or length < 0:
                    self.close_connection = True
                    raise ProtocolError(f"the body is over {MAX_BODY_BYTES} bytes", code="request_too_large", status=413)
                try:
                    return json.loads(self.rfile.read(length) or b"null")
                except (ValueError, UnicodeDecodeError):
                    raise ProtocolError("We could not parse the JSON body of your request.", code="invalid_json") from None

            def _serve(self, method: str) -> None:
                try:
                    body = self._body() if method == "POST" else None
                    if self.path != "/health" and not server.authorized(self.headers.get("Authorization")):
                        raise ProtocolError("Missing or wrong serving token.", code="invalid_api_key", status=401)
                    status, answer = server.handle(method, self.path, body)
                except ProtocolError as error:
                    status, answer = error.status, error.body()
                except Exception as error:  # the backend failed: say so, keep serving
                    logger.exception("serving request failed")
                    status, answer = 500, ProtocolError(f"inference failed: {type(error).__name__}", code="internal_error", status=500).body()
                if isinstance(answer, dict):
                    self._json(status, answer)
                else:
                    self._stream(answer)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_DELETE(self):
                self._serve("DELETE")

            def log_message(self, *args):
                pass

        return ThreadingHTTPServer((host, port), Handler)
