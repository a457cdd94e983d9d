"""The OpenAI-compatible API (serving/api/): OpenAI's answers and streams relayed from a deployment's
server with the client's model name, tokens billed once per request, and every refusal in OpenAI's
error body: another organization's deployment as unknown as a missing one, scopes, rate limits,
billing, a model not ready, a server that does not start in time.

The async views run under Django's async test client; their database work runs in worker threads,
which must see the test's rows (``transaction=True``). The inference server is the engine's
serving role on the tiny model, in a thread of this process.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from billing.accounts import account_for
from billing.models import BillingAccount, TokenUsage
from lab.audit import Actor
from lab.services import api_key_create
from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus, ServingMode, SourceType
from tests.support.serving import tiny_serving_engine
from tests.support.tiny_lora import tiny_lora

pytestmark = pytest.mark.django_db(transaction=True)

TINY = "lab/tiny-random-llama"
URL = "/api/v1/openai/v1"
CHAT = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 5, "temperature": 0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The tiny model's serving role on a free port, with one adapter registered as ``adp_one``."""
    adapter_dir = tmp_path_factory.mktemp("adapter")
    tiny_lora(0.5)[0].save_pretrained(adapter_dir)
    with tiny_serving_engine(max_adapters=2) as (server, url):
        server.handle("POST", "/v1/adapters", {"name": "adp_one", "path": str(adapter_dir)})
        yield server, url


@pytest.fixture
def deployed(owner, engine):
    """A running base server at the engine and two ready deployments of the owner on it: the
    adapter ``adp_one`` (named ``tuned``) and the base model."""
    _, url = engine
    server = InferenceServer.objects.create(key=f"base:{TINY}", model=TINY, served_model=TINY, status=ServerStatus.RUNNING,
                                            url=url, token="engine-token", generation=1, handle={"workdir": "/nonexistent"})
    common = {"organization": owner.organization, "project": owner.project, "base_model": TINY, "server": server, "status": DeploymentStatus.READY}
    tuned = Deployment.objects.create(name="tuned", source_type=SourceType.ADAPTER, source_id="adp_one", mode=ServingMode.ADAPTER, **common)
    base = Deployment.objects.create(name=TINY, source_type=SourceType.MODEL, source_id=TINY, mode=ServingMode.BASE, **common)
    return {"server": server, "tuned": tuned, "base": base}


def call(method: str, path: str, key: str | None, body=None) -> tuple[int, dict | list, dict]:
    """Call the API through the async test client; return (status, JSON body or stream events, headers)."""
    async def go():
        client = AsyncClient()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if method == "GET":
            response = await client.get(URL + path, headers=headers)
        else:
            data = body if isinstance(body, (str, bytes)) else json.dumps(body)
            response = await client.post(URL + path, data=data, content_type="application/json", headers=headers)
        if response.streaming:
            raw = b"".join([chunk async for chunk in response.streaming_content]).decode()
            events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
            return response.status_code, [event if event == "[DONE]" else json.loads(event) for event in events], dict(response.headers)
        return response.status_code, json.loads(response.content), dict(response.headers)

    return async_to_sync(go)()


def test_a_chat_completion_answers_under_the_deployment_name_and_is_billed_once(owner, deployed, engine):
    status, body, _ = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT})
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["model"] == "tuned"
    direct = engine[0].handle("POST", "/v1/chat/completions", {"model": "adp_one", **CHAT})[1]
    assert body["choices"] == direct["choices"] and body["usage"] == direct["usage"]
    usage = TokenUsage.objects.unscoped().get()
    assert (usage.deployment_public_id, usage.model) == (deployed["tuned"].public_id, TINY)
    assert (usage.prompt_tokens, usage.completion_tokens) == (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"])
    assert usage.request_id.startswith("req_") and usage.project == owner.project
    deployed["server"].refresh_from_db()
    assert deployed["server"].last_request_at is not None


def test_a_stream_is_relayed_as_openai_streams_it_and_billed_once(owner, deployed):
    status, whole, _ = call("POST", "/chat/completions", owner.key, {"model": TINY, **CHAT})
    status, events, headers = call("POST", "/chat/completions", owner.key, {"model": TINY, **CHAT, "stream": True})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["model"] == TINY and "usage" not in chunk for chunk in chunks)  # no usage asked for: none sent
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks) == whole["choices"][0]["message"]["content"]
    usages = list(TokenUsage.objects.unscoped().order_by("pk").values_list("prompt_tokens", "completion_tokens"))
    assert usages == [(whole["usage"]["prompt_tokens"], whole["usage"]["completion_tokens"])] * 2
    # latency as Lab measured it: the stream's first sampled text before its end, none for the whole answer
    (whole_ms, whole_first), (stream_ms, stream_first) = TokenUsage.objects.unscoped().order_by("pk").values_list("duration_ms", "first_token_ms")
    assert whole_ms > 0 and whole_first is None
    assert 0 < stream_first <= stream_ms


def test_a_stream_sends_the_usage_chunks_the_client_asks_for(owner, deployed):
    body = {"model": "tuned", "prompt": "abc", "max_tokens": 4, "temperature": 0, "stream": True}
    _, events, _ = call("POST", "/completions", owner.key, {**body, "stream_options": {"include_usage": True}})
    chunks = events[:-1]
    assert [chunk["usage"] for chunk in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    _, events, _ = call("POST", "/completions", owner.key, {**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert all(chunk["usage"] is not None for chunk in events[:-1])


def test_a_deployment_is_also_named_by_base_and_source_id_and_by_its_id(owner, deployed):
    for name in (f"{TINY}:adp_one", deployed["tuned"].public_id):
        status, body, _ = call("POST", "/chat/completions", owner.key, {"model": name, **CHAT})
        assert status == 200 and body["model"] == name


def test_models_lists_what_the_key_may_call(owner, outsider, deployed):
    status, body, _ = call("GET", "/models", owner.key)
    assert status == 200 and body["object"] == "list"
    assert [(item["id"], item["object"], item["owned_by"]) for item in body["data"]] == [("tuned", "model", owner.organization.slug), (TINY, "model", owner.organization.slug)]
    assert call("GET", "/models", outsider.key)[1] == {"object": "list", "data": []}


def test_another_organizations_deployment_is_model_not_found_exactly_as_a_missing_one(owner, outsider, deployed):
    for name in ("tuned", deployed["tuned"].public_id, f"{TINY}:adp_one"):
        theirs = call("POST", "/chat/completions", outsider.key, {"model": name, **CHAT})
        missing = call("POST", "/chat/completions", outsider.key, {"model": name + "x", **CHAT})
        assert theirs[0] == missing[0] == 404
        assert theirs[1]["error"] == {**missing[1]["error"], "message": missing[1]["error"]["message"].replace(name + "x", name)}
        assert theirs[1]["error"]["code"] == "model_not_found" and set(theirs[1]["error"]) == {"message", "type", "param", "code"}
    assert not TokenUsage.objects.unscoped().exists()


def test_keys_need_the_inference_or_write_scope(owner, deployed):
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    _, inference_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="app", scopes=["inference"])
    assert call("POST", "/chat/completions", None, {"model": "tuned", **CHAT})[1]["error"]["code"] == "invalid_api_key"
    assert call("POST", "/chat/completions", "lab_not_a_key_at_all_0000", {"model": "tuned", **CHAT})[0] == 401
    status, body, _ = call("POST", "/chat/completions", read_key, {"model": "tuned", **CHAT})
    assert (status, body["error"]["code"]) == (403, "insufficient_scope")
    assert call("POST", "/chat/completions", inference_key, {"model": "tuned", **CHAT})[0] == 200
    assert owner.client(inference_key).get("/api/v1/deployments").status_code == 403  # nothing but inference


def test_each_key_is_rate_limited(owner, deployed, settings):
    settings.LAB_INFERENCE_RATE_LIMIT_PER_MINUTE = 2
    assert call("GET", "/models", owner.key)[0] == call("GET", "/models", owner.key)[0] == 200
    status, body, headers = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT})
    assert (status, body["error"]["code"]) == (429, "rate_limited") and int(headers["Retry-After"]) >= 1
    assert not TokenUsage.objects.unscoped().exists()


def test_nothing_is_sampled_when_billing_allows_nothing_to_run(owner, deployed, settings):
    settings.STRIPE_API_KEY = "sk_test_lab"
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(balance_micro_usd=0)
    status, body, _ = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT})
    assert (status, body["error"]["code"], body["error"]["type"]) == (402, "insufficient_credit", "payment_error")
    assert not TokenUsage.objects.unscoped().exists()


def test_bad_requests_are_refused_with_openai_errors_and_bill_nothing(owner, deployed):
    assert call("POST", "/chat/completions", owner.key, "{not json")[1]["error"]["code"] == "invalid_json"
    assert call("POST", "/chat/completions", owner.key, {"messages": []})[1]["error"]["param"] == "model"
    status, body, _ = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT, "temperature": 5})
    assert (status, body["error"]["param"], body["error"]["code"]) == (400, "temperature", "invalid_value")
    status, body, _ = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT, "stream": True, "tools": []})
    assert (status, body["error"]["code"]) == (400, "unknown_parameter")
    assert call("GET", "/chat/completions", owner.key)[0] == 405
    assert not TokenUsage.objects.unscoped().exists()


def test_a_deployment_not_ready_yet_answers_503_with_retry_after(owner, deployed):
    Deployment.objects.unscoped().filter(pk=deployed["tuned"].pk).update(status=DeploymentStatus.DEPLOYING)
    status, body, headers = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT})
    assert (status, body["error"]["code"], headers["Retry-After"]) == (503, "model_not_ready", "5")


def test_a_request_to_a_stopped_server_starts_it_and_waits_for_it_at_most_the_wake_timeout(owner, deployed, settings):
    settings.LAB_SERVING_WAKE_TIMEOUT_S = 1
    InferenceServer.objects.filter(pk=deployed["server"].pk).update(status=ServerStatus.STOPPED)
    status, body, _ = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT})
    assert (status, body["error"]["code"]) == (503, "model_not_ready")
    server = InferenceServer.objects.get(pk=deployed["server"].pk)
    assert (server.status, server.generation) == (ServerStatus.STARTING, 2)  # claimed once; the reconcile pass starts it
    assert not TokenUsage.objects.unscoped().exists()


@pytest.fixture
def breaking_server():
    """An inference server stand-in that answers a stream with one chunk (usage so far: 7 prompt
    tokens, 1 completion token) and then drops the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    chunk = json.dumps({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "adp_one",
                        "choices": [{"index": 0, "delta": {"content": "h"}, "logprobs": None, "finish_reason": None}],
                        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}).encode()

    def serve():
        connection, _ = listener.accept()
        connection.recv(65536)
        frame = b"data: " + chunk + b"\n\n"
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + b"%x\r\n%s\r\n" % (len(frame), frame))
        connection.close()

    threading.Thread(target=serve, daemon=True).start()
    yield "http://127.0.0.1:%d" % listener.getsockname()[1]
    listener.close()


def test_a_server_breaking_off_mid_stream_ends_it_with_an_error_event_and_bills_what_was_sampled(owner, deployed, breaking_server):
    InferenceServer.objects.filter(pk=deployed["server"].pk).update(url=breaking_server)
    status, events, _ = call("POST", "/chat/completions", owner.key, {"model": "tuned", **CHAT, "stream": True})
    assert status == 200
    assert events[0]["choices"][0]["delta"] == {"content": "h"} and events[0]["model"] == "tuned"
    assert events[1]["error"]["code"] == "upstream_error" and events[-1] != "[DONE]"
    usage = TokenUsage.objects.unscoped().get()
    assert (usage.prompt_tokens, usage.completion_tokens) == (7, 1)
