"""``/api/v1/openai/v1/chat/completions``, ``/completions`` and ``/models``: OpenAI's API in front of
the project's deployments (docs/serving.md "The OpenAI-compatible API").

Async views, served by the ASGI server without a thread per request, as the live stream is: the
database work runs in worker threads (``serving.api.gateway``), the request is relayed to
the deployment's inference server with one pooled ``httpx.AsyncClient`` per event loop, and a
stream is relayed chunk by chunk as it arrives (server-sent events exactly as OpenAI sends them).
A request to a deployment whose server was scaled to zero starts it and waits for it, at most
``LAB_SERVING_WAKE_TIMEOUT_S``. Upstream, Lab always asks for the usage of every chunk
(``stream_options.continuous_usage_stats``), so the tokens of a stream the client leaves early
are known too; the client gets the usage chunks it asked for and no others. Each request is
recorded on the token ledger once, under its ``req_...`` id, when it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine.serving_protocol import CompletionRequest, ProtocolError, parse_chat, parse_completion
from lab.ids import public_id
from lab.lib.jsonbounds import JSONTooDeep, json_loads
from serving.api import gateway
from serving.api.gateway import InferenceError, Target
from serving.models import ServerStatus

logger = logging.getLogger(__name__)

_prepare, _wake, _record, _models = gateway.prepare, gateway.wake, gateway.record, gateway.callable_models
#: Seconds between looks at a server that is starting, while a request waits for it.
WAKE_POLL_S = 0.25
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def _client() -> httpx.AsyncClient:
    """Return this event loop's client for inference servers (its connections are pooled)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        timeout = httpx.Timeout(connect=10.0, read=float(settings.LAB_SERVING_REQUEST_TIMEOUT_S), write=30.0, pool=30.0)
        client = _clients[loop] = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
    return client


def _method_not_allowed(allowed: str) -> JsonResponse:
    response = InferenceError(405, "method_not_allowed", f"Use {allowed} here.").response()
    response["Allow"] = allowed
    return response


def _body(request: HttpRequest, parse: Callable[[object], CompletionRequest], model: str | None = None) -> tuple[dict, CompletionRequest]:
    """Return the JSON body and what it asks for, checked by ``parse`` as the inference server
    checks it (engine/serving_protocol.py); raise its 400 before any server is woken for what
    none could take (a body that is no object, unknown parameters, messages that are no list of
    messages, ``n`` or ``max_tokens`` out of bounds)."""
    try:
        body = json_loads(request.body or b"null")
    except JSONTooDeep as error:
        raise InferenceError(400, "invalid_json", f"The JSON body of your request is {error}.") from None
    except (ValueError, UnicodeDecodeError):
        raise InferenceError(400, "invalid_json", "We could not parse the JSON body of your request.") from None
    if model is not None and isinstance(body, dict):
        body["model"] = model
    try:
        return body, parse(body)
    except ProtocolError as error:
        raise InferenceError(error.status, error.code, str(error), param=error.param) from None


async def _running(target: Target) -> Target:
    """Return the target once its server runs, starting it when it was scaled to zero; raise 503
    when it fails to start or does not run within ``LAB_SERVING_WAKE_TIMEOUT_S``."""
    deadline = time.monotonic() + settings.LAB_SERVING_WAKE_TIMEOUT_S
    woken = False
    while target.server_status != ServerStatus.RUNNING:
        if woken and target.server_status == ServerStatus.FAILED:
            raise InferenceError(503, "model_not_ready", f"The server of `{target.model}` failed to start; try again later.",
                                 param="model", retry_after_s=gateway.RETRY_AFTER_S)
        if time.monotonic() > deadline:
            raise InferenceError(503, "model_not_ready", f"The server of `{target.model}` did not start within "
                                 f"{settings.LAB_SERVING_WAKE_TIMEOUT_S} s; try again.", param="model", retry_after_s=gateway.RETRY_AFTER_S)
        woken = woken or target.server_status in (ServerStatus.STOPPED, ServerStatus.FAILED)
        target = await _wake(target)
        if target.server_status != ServerStatus.RUNNING:
            await asyncio.sleep(WAKE_POLL_S)
    return target


def _unavailable(target: Target, error: Exception) -> InferenceError:
    logger.warning("inference server of %s unreachable: %s", target.deployment_id, error)
    return InferenceError(503, "model_not_ready", f"The server of `{target.model}` is not answering; try again.",
                          param="model", retry_after_s=gateway.RETRY_AFTER_S)


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


async def _complete(request: HttpRequest, path: str, parse: Callable[[object], CompletionRequest]) -> HttpResponse:
    """Relay one completion request of an API key (``path`` on the server, its body checked by
    ``parse``) for the deployment its ``model`` names."""
    authorization = request.headers.get("Authorization")
    return await relay(request, path, parse, prepare=lambda model: _prepare(authorization, model))


async def relay(
    request: HttpRequest, path: str, parse: Callable[[object], CompletionRequest], *, prepare: Callable[[str], Awaitable[Target]],
    model: str | None = None,
) -> HttpResponse:
    """Relay one completion request (``path`` on the server, its body checked by ``parse``) for the
    deployment its ``model`` names (``model`` in place of the body's when given), found by
    ``prepare`` (which authenticates and raises ``InferenceError``): the API keys' routes here, the
    dashboard's playground for a member.
    Answers OpenAI's body, or its stream of server-sent events; records the tokens once."""
    started = time.monotonic()
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        body, asked = _body(request, parse, model)
        model, stream = asked.model, asked.stream
        target = await _running(await prepare(model))
    except InferenceError as error:
        return error.response()
    request_id = public_id("req")
    upstream = {**body, "model": target.upstream_model}
    if stream:
        upstream["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    client = _client()
    headers = {"Authorization": f"Bearer {target.token}"}
    try:
        answer = await client.send(client.build_request("POST", target.url + path, json=upstream, headers=headers), stream=stream)
    except httpx.HTTPError as error:
        return _unavailable(target, error).response()
    if not stream or answer.status_code != 200:
        try:
            data = json.loads(await answer.aread()) if stream else answer.json()
        except ValueError:
            return _unavailable(target, ValueError(f"an answer of status {answer.status_code} that is not JSON")).response()
        finally:
            await answer.aclose()
        if answer.status_code == 404:  # the server does not know the deployment (restarted outside Lab): not the caller's doing
            return _unavailable(target, ValueError("the server does not hold the deployment")).response()
        if answer.status_code == 200:
            data["model"] = model
            await _record(target, request_id, data.get("usage"), _elapsed_ms(started))
        return JsonResponse(data, status=answer.status_code)
    chunks = _relay(answer, target, request_id, model=model, include_usage=asked.include_usage, continuous=asked.continuous_usage, started=started)
    response = StreamingHttpResponse(chunks, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass chunks on as they come
    return response


async def _relay(
    answer: httpx.Response, target: Target, request_id: str, *, model: str, include_usage: bool, continuous: bool, started: float,
) -> AsyncIterator[bytes]:
    """Yield the server's chunks as the client asked for them (its model name, the usage chunks
    it wanted), an error event when the server breaks off, and record the tokens once the stream
    ends, however it ends (those sampled until then, from the server's running usage), with the
    time to its first sampled chunk and to its end (milliseconds since ``started``)."""
    usage = first_token_ms = None
    try:
        async for line in answer.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                yield b"data: [DONE]\n\n"
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise httpx.DecodingError(f"a chunk that is not JSON: {payload[:80]!r}") from None
            if "error" not in chunk:
                usage = chunk.get("usage") or usage
                if first_token_ms is None and _sampled(chunk):
                    first_token_ms = _elapsed_ms(started)
                if not chunk.get("choices") and not include_usage:
                    continue  # the closing usage chunk, which the client did not ask for
                if include_usage or continuous:
                    chunk["usage"] = chunk.get("usage") if (continuous or not chunk.get("choices")) else None
                else:
                    chunk.pop("usage", None)
                chunk["model"] = model
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    except httpx.HTTPError as error:  # the server went away mid-stream: say so in the stream, as OpenAI does
        logger.warning("stream from the server of %s broke: %s", target.deployment_id, error)
        failure = InferenceError(502, "upstream_error", f"The server of `{model}` stopped answering mid-stream; the answer is incomplete.")
        yield b"data: " + json.dumps(failure.body(), separators=(",", ":")).encode() + b"\n\n"
    finally:
        await asyncio.shield(_finish(answer, target, request_id, usage, _elapsed_ms(started), first_token_ms))


def _sampled(chunk: dict) -> bool:
    """Whether a chunk carries sampled text (a chat stream opens with an empty role delta)."""
    return any(choice.get("text") or (choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or ())


async def _finish(answer: httpx.Response, target: Target, request_id: str, usage: dict | None, duration_ms: int, first_token_ms: int | None) -> None:
    await answer.aclose()
    await _record(target, request_id, usage, duration_ms, first_token_ms)


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """``POST /api/v1/openai/v1/chat/completions`` (OpenAI's chat completions)."""
    return await _complete(request, "/v1/chat/completions", parse_chat)


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    """``POST /api/v1/openai/v1/completions`` (OpenAI's text completions)."""
    return await _complete(request, "/v1/completions", parse_completion)


@csrf_exempt
async def models(request: HttpRequest) -> HttpResponse:
    """``GET /api/v1/openai/v1/models``: the models the key may call (its project's ready deployments)."""
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        data = await _models(request.headers.get("Authorization"))
    except InferenceError as error:
        return error.response()
    return JsonResponse({"object": "list", "data": data})
