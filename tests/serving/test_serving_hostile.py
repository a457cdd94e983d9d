"""Deployments and the OpenAI-compatible API against a hostile caller (docs/serving.md): bodies of
wrong types, sizes and characters, keys of the wrong scope, another organization's ids and
cursors, concurrent creates under one ``Idempotency-Key``, and OpenAI requests no server could
take. Each is a clean 4xx that creates, wakes and bills nothing.

The OpenAI API's database work runs in worker threads, and the concurrent creates run in threads,
so those tests commit (``transaction=True``); the others roll back."""

from __future__ import annotations

import json
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.test import AsyncClient
from rest_framework.test import APIClient

from billing.models import TokenUsage
from lab.audit import Actor
from lab.services import api_key_create
from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus, ServingMode, SourceType

BASE = "/api/v1/deployments"
OPENAI = "/api/v1/openai/v1"
TINY = "lab/tiny-random-llama"
MODEL = {"type": "model", "id": TINY}
CHAT = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 5}


# --- the deployments API -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body, param",
    [
        ({"source": MODEL, "name": "chat\n"}, "name"),
        ({"source": MODEL, "name": "chat\x00"}, "name"),
        ({"source": MODEL, "name": "ch\u00e4t"}, "name"),
        ({"source": MODEL, "name": ""}, "name"),
        ({"source": MODEL, "name": 12}, "name"),
        ({"source": MODEL, "name": ["chat"]}, "name"),
        ({"source": {"type": "adapter", "id": "adp_\x00"}}, "source.id"),
        ({"source": {"type": "checkpoint", "id": "ckpt_\ud800"}}, "source.id"),
        ({"source": {"type": "model", "id": "lab/tiny\x00"}}, "source.id"),
        ({"source": {"type": "model", "id": "x" * 100_000}}, "source.id"),
        ({"source": {"type": ["model"], "id": TINY}}, "source.type"),
        ({"source": {"type": None, "id": TINY}}, "source.type"),
        ({"source": {"type": "model", "id": 7}}, "source"),
        ({"source": {"type": "model", "id": TINY, "extra": 1}}, "source"),
        ({"source": [MODEL]}, "source"),
    ],
)
def test_a_hostile_create_is_a_clean_400_naming_the_field_and_creates_nothing(owner, body, param):
    response = owner.client().post(BASE, json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("invalid_request", param)
    assert not Deployment.objects.unscoped().exists()


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["{not json", "[]", "null", '"source"', "7", '{"source": NaN}', "{" * 5000])
def test_a_body_that_is_no_json_object_is_a_400(owner, raw):
    response = owner.client().post(BASE, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert not Deployment.objects.unscoped().exists()


@pytest.mark.django_db
def test_an_inference_key_may_neither_read_nor_change_deployments(owner):
    created = owner.client().post(BASE, {"source": MODEL}, format="json").json()
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="app", scopes=["inference"])
    client = owner.client(key)
    assert client.get(BASE).status_code == 403
    assert client.get(f"{BASE}/{created['id']}").status_code == 403
    assert client.get(f"{BASE}/{created['id']}/events").status_code == 403
    assert client.post(BASE, {"source": MODEL, "name": "other"}, format="json").status_code == 403
    assert client.delete(f"{BASE}/{created['id']}").status_code == 403
    assert list(Deployment.objects.unscoped().values_list("status", flat=True)) == [DeploymentStatus.PENDING]


@pytest.mark.django_db
def test_cursors_of_other_lists_and_other_tenants_are_not_found(owner, outsider):
    mine = owner.client().post(BASE, {"source": MODEL}, format="json").json()
    theirs = outsider.client().post(BASE, {"source": MODEL}, format="json").json()
    their_event = outsider.client().get(f"{BASE}/{theirs['id']}/events").json()["data"][0]["id"]
    client = owner.client()
    foreign, missing = client.get(BASE, {"after": theirs["id"]}), client.get(BASE, {"after": "dep_00000000000000000000"})
    assert foreign.status_code == missing.status_code == 404
    events = f"{BASE}/{mine['id']}/events"
    assert client.get(events, {"after": their_event}).status_code == 404
    assert client.get(events, {"after": mine["id"]}).status_code == 404
    assert client.get(BASE, {"after": "dep_" + "x" * 10_000}).status_code == 404
    assert client.get(BASE, {"after": "dep\x00"}).status_code == 400
    for limit in ("-1", "0", "many", str(10**30)):
        assert client.get(BASE, {"limit": limit}).status_code == 400, limit
    for deployment_id in ("dep_" + "x" * 5000, "dep_\u00e9", "' OR 1=1 --"):
        assert client.get(f"{BASE}/{deployment_id}").status_code == 404
        assert client.delete(f"{BASE}/{deployment_id}").status_code == 404
    assert Deployment.objects.unscoped().filter(status=DeploymentStatus.PENDING).count() == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_under_one_idempotency_key_create_one_deployment(owner):
    answers, barrier = [], threading.Barrier(4)

    def create():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.key}", HTTP_IDEMPOTENCY_KEY="deploy-once")
        barrier.wait()
        try:
            response = client.post(BASE, {"source": MODEL, "name": "chat"}, format="json")
            answers.append((response.status_code, response.json().get("id")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    deployment = Deployment.objects.unscoped().get()
    assert answers == [(201, deployment.public_id)] * 4  # the first's answer, replayed to the others


# --- the OpenAI-compatible API ---------------------------------------------------------------------


@pytest.fixture
def asleep(owner):
    """A ready deployment ``tuned`` of the owner on a base server scaled to zero (nothing listens at
    its address): a request that reaches it would wake it."""
    server = InferenceServer.objects.create(key=f"base:{TINY}", model=TINY, served_model=TINY, status=ServerStatus.STOPPED,
                                            url="http://127.0.0.1:9", token="t", generation=1, handle={})
    Deployment.objects.create(organization=owner.organization, project=owner.project, name="tuned", base_model=TINY, server=server,
                              status=DeploymentStatus.READY, source_type=SourceType.ADAPTER, source_id="adp_one", mode=ServingMode.ADAPTER)
    return server


def call(key: str, path: str, body) -> tuple[int, dict, bool]:
    """POST ``body`` (JSON, or raw text or bytes) to the OpenAI API; return (status, JSON body, streamed)."""
    async def go():
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        response = await AsyncClient().post(OPENAI + path, data=data, content_type="application/json",
                                            headers={"Authorization": f"Bearer {key}"})
        if response.streaming:
            return response.status_code, {}, True
        return response.status_code, json.loads(response.content), False
    return async_to_sync(go)()


def untouched(server: InferenceServer) -> bool:
    server.refresh_from_db()
    return (server.status, server.generation) == (ServerStatus.STOPPED, 1) and not TokenUsage.objects.unscoped().exists()


#: Requests no inference server takes (engine/serving_protocol.py): (path, changes to a good body, param).
REFUSED = [
    ("/chat/completions", {"messages": "hello"}, "messages"),
    ("/chat/completions", {"messages": []}, "messages"),
    ("/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ("/chat/completions", {"messages": [{"role": "user", "content": {"x": 1}}]}, "messages.0.content"),
    ("/chat/completions", {"n": 9}, "n"),
    ("/chat/completions", {"n": 0}, "n"),
    ("/chat/completions", {"n": "2"}, "n"),
    ("/chat/completions", {"max_tokens": 10**30}, "max_tokens"),
    ("/chat/completions", {"max_tokens": -1}, "max_tokens"),
    ("/chat/completions", {"max_tokens": 1.5}, "max_tokens"),
    ("/chat/completions", {"max_completion_tokens": 10**30, "max_tokens": None}, "max_completion_tokens"),
    ("/chat/completions", {"tools": [{"type": "function", "function": "garbage"}]}, "tools"),
    ("/chat/completions", {"tools": "garbage", "tool_choice": 7}, "tool_choice"),
    ("/chat/completions", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/chat/completions", {"temperature": float("inf")}, "temperature"),
    ("/chat/completions", {"stream": "yes"}, "stream"),
    ("/chat/completions", {"stream": 1}, "stream"),
    ("/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/chat/completions", {"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ("/chat/completions", {"logprobs": True}, "logprobs"),
    ("/completions", {"prompt": {"text": "hi"}}, "prompt"),
    ("/completions", {"prompt": ""}, "prompt"),
    ("/completions", {"prompt": "hi", "echo": True}, "echo"),
    ("/completions", {"prompt": "hi", "best_of": 3}, "best_of"),
]
#: Bodies that are no JSON object, or nest too deep.
NOT_OBJECTS = ["{not json", "[]", "null", '"tuned"', b"\xff\xfe", "[" * 100_000 + "]" * 100_000,
               '{"model": "tuned", "messages": ' + "[" * 70 + "]" * 70 + "}"]


@pytest.mark.django_db(transaction=True)
def test_a_request_no_server_could_take_is_a_400_that_wakes_and_bills_nothing(owner, asleep, settings):
    settings.LAB_SERVING_WAKE_TIMEOUT_S = 1
    for path, changes, param in REFUSED:
        base = {"model": "tuned", "max_tokens": 5} if path == "/completions" else {"model": "tuned", **CHAT}
        body = {key: value for key, value in {**base, **changes}.items() if value is not None}
        status, answer, streamed = call(owner.key, path, json.dumps(body))
        error = answer["error"]
        assert (status, streamed, error["type"], error["param"]) == (400, False, "invalid_request_error", param), answer
    for raw in NOT_OBJECTS:
        status, answer, streamed = call(owner.key, "/chat/completions", raw)
        assert (status, answer["error"]["code"], streamed) == (400, "invalid_json", False), (raw[:20], answer)
    assert untouched(asleep)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True])
def test_a_hostile_model_name_is_model_not_found_as_a_missing_one(owner, outsider, asleep, stream):
    missing = call(owner.key, "/chat/completions", {"model": "nothing", **CHAT, "stream": stream})
    assert missing[0] == 404 and missing[1]["error"]["code"] == "model_not_found" and not missing[2]
    for name in ("tuned\x00", "tuned\ud800", "x" * 100_000, "dep_" + "x" * 1000, f"{TINY}:adp_\x00", "tuned\n"):
        status, answer, streamed = call(owner.key, "/chat/completions", json.dumps({"model": name, **CHAT, "stream": stream}))
        assert (status, answer["error"]["code"], streamed) == (404, "model_not_found", False), (name[:20], answer)
    theirs = call(outsider.key, "/chat/completions", {"model": "tuned", **CHAT, "stream": stream})
    mine_missing = call(outsider.key, "/chat/completions", {"model": "tunedx", **CHAT, "stream": stream})
    assert theirs[0] == mine_missing[0] == 404
    assert theirs[1]["error"]["message"].replace("`tuned`", "`M`") == mine_missing[1]["error"]["message"].replace("`tunedx`", "`M`")
    assert untouched(asleep)


@pytest.mark.django_db(transaction=True)
def test_keys_without_inference_wake_nothing(owner, asleep):
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    assert call(read_key, "/chat/completions", {"model": "tuned", **CHAT})[0] == 403
    assert call("lab_" + "x" * 60, "/chat/completions", {"model": "tuned", **CHAT})[0] == 401

    async def models(authorization: str):
        return await AsyncClient().get(f"{OPENAI}/models", headers={"Authorization": authorization})

    for authorization in ("Bearer", "Basic dXNlcjpwdw==", "Bearer " + "x" * 10_000, "Bearer lab_\u00e9t\u00e9", "bearer  "):
        response = async_to_sync(models)(authorization)
        assert response.status_code == 401, (authorization[:20], response.content)
    assert untouched(asleep)
