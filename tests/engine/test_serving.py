"""The serving role (engine/serving.py) in this process: OpenAI's answers and stream chunks, adapters
loaded by name with the least recently used unloaded first, and what it refuses."""

from __future__ import annotations

import json

import openai
import pytest
import torch

from engine.models import context_length, stop_token_ids, tiny_random_llama
from engine.serving import ServingServer
from engine.serving_protocol import ProtocolError
from engine.serving_transformers import TransformersServing
from tests.support import http_server
from tests.support.tiny_lora import TINY, tiny_lora

CHAT = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    """Three rank-4 adapters of the tiny model, each changing its predictions differently."""
    root = tmp_path_factory.mktemp("adapters")
    for index, (fill, seed) in enumerate(((0.5, 0), (-0.5, 3), (0.3, 1))):  # four distinct greedy answers
        model, _ = tiny_lora(fill, seed)
        model.save_pretrained(root / f"a{index}")
    return [root / f"a{index}" for index in range(3)]


@pytest.fixture
def server():
    model, tokenizer = tiny_random_llama()
    return ServingServer(
        backend=TransformersServing(model, stop_token_ids=stop_token_ids(model, tokenizer)), tokenizer=tokenizer,
        served_model=TINY, max_model_len=context_length(model), token="secret", max_adapters=2,
    )


def chat(server, **body):
    status, answer = server.handle("POST", "/v1/chat/completions", {"model": TINY, **CHAT, **body})
    assert status == 200
    return answer


def frames(stream) -> list:
    """The decoded `data:` payloads of a stream (the last one is the string [DONE])."""
    payloads = [frame.decode().removeprefix("data: ").removesuffix("\n\n") for frame in stream]
    return [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def test_it_answers_a_chat_completion_as_openai_does(server):
    answer = chat(server)
    assert answer["object"] == "chat.completion"
    assert answer["model"] == TINY
    assert answer["id"].startswith("chatcmpl-")
    assert len(answer["choices"]) == 1
    choice = answer["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant" and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    prompt = server.tokenizer.apply_chat_template(CHAT["messages"], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert answer["usage"]["prompt_tokens"] == len(prompt)
    assert answer["usage"]["total_tokens"] == len(prompt) + answer["usage"]["completion_tokens"]
    assert chat(server)["choices"] == answer["choices"]  # greedy sampling is repeatable


def test_a_stream_sends_the_same_text_in_openai_chunks(server):
    whole = chat(server, max_tokens=5)
    status, stream = server.handle("POST", "/v1/chat/completions", {"model": TINY, **CHAT, "max_tokens": 5, "stream": True,
                                                                     "stream_options": {"include_usage": True}})
    events = frames(stream)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    assert chunks[-2]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": whole["choices"][0]["finish_reason"]}]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks[1:-2])
    assert text == whole["choices"][0]["message"]["content"]


def test_continuous_usage_counts_every_token_as_it_goes(server):
    _, stream = server.handle("POST", "/v1/completions", {"model": TINY, "prompt": "abc", "max_tokens": 4, "temperature": 0, "stream": True,
                                                          "stream_options": {"continuous_usage_stats": True}})
    chunks = frames(stream)[:-1]
    assert [chunk["usage"]["completion_tokens"] for chunk in chunks][-1] == 4
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_stop_string_ends_the_text_before_it(server):
    text = chat(server, max_tokens=8)["choices"][0]["message"]["content"]
    stop = text[3:5]
    answer = chat(server, max_tokens=8, stop=[stop])
    assert answer["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_n_choices_are_sampled_with_their_own_seeds(server):
    answer = chat(server, n=3, temperature=1.0, seed=7)
    assert [choice["index"] for choice in answer["choices"]] == [0, 1, 2]
    assert chat(server, n=3, temperature=1.0, seed=7)["choices"] == answer["choices"]


def test_adapters_change_the_answer_and_the_base_model_answers_as_before(server, adapter_dirs):
    base = chat(server)["choices"]
    for index, directory in enumerate(adapter_dirs[:2]):
        assert server.handle("POST", "/v1/adapters", {"name": f"a{index}", "path": str(directory)}) == (200, {"name": f"a{index}", "resident": True})
    first, second = chat(server, model="a0")["choices"], chat(server, model="a1")["choices"]
    assert first != base and second != base and first != second
    assert chat(server)["choices"] == base
    assert chat(server, model="a0")["choices"] == first


def test_at_most_max_adapters_stay_loaded_and_the_least_recently_used_goes_first(server, adapter_dirs):
    for index, directory in enumerate(adapter_dirs):
        server.handle("POST", "/v1/adapters", {"name": f"a{index}", "path": str(directory), "load": False})
    answers = {name: chat(server, model=name)["choices"] for name in ("a0", "a1")}
    assert server.health()["adapters"]["resident"] == ["a0", "a1"]
    chat(server, model="a0")
    chat(server, model="a2")  # a1 is the least recently used
    assert server.health()["adapters"] == {"registered": ["a0", "a1", "a2"], "resident": ["a0", "a2"], "max_resident": 2}
    assert chat(server, model="a1")["choices"] == answers["a1"]  # loaded again, the same weights
    assert server.health()["adapters"]["resident"] == ["a2", "a1"]
    assert server.handle("DELETE", "/v1/adapters/a2", None) == (200, {"name": "a2", "deleted": True})
    assert server.health()["adapters"] == {"registered": ["a0", "a1"], "resident": ["a1"], "max_resident": 2}
    with pytest.raises(ProtocolError) as refused:
        chat(server, model="a2")
    assert (refused.value.status, refused.value.code) == (404, "model_not_found")


def test_it_refuses_what_is_not_a_safetensors_lora_adapter(server, adapter_dirs, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text((adapter_dirs[0] / "adapter_config.json").read_text())
    torch.save({}, pickled / "adapter_model.bin")
    for body in ({"name": "x", "path": str(pickled)}, {"name": "x", "path": str(tmp_path)}, {"name": TINY, "path": str(adapter_dirs[0])}, {"name": "x"}):
        with pytest.raises(ProtocolError) as refused:
            server.handle("POST", "/v1/adapters", body)
        assert refused.value.status == 400
    assert server.health()["adapters"]["registered"] == []


@pytest.mark.parametrize("body, param, code", [
    ({"model": "nope"}, "model", "model_not_found"),
    ({"max_tokens": 100_000}, "max_tokens", "context_length_exceeded"),
    ({"temperature": 3}, "temperature", "invalid_value"),
    ({"tools": []}, "tools", "unknown_parameter"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "invalid_value"),
    ({"messages": []}, "messages", "invalid_type"),
    ({"stream": "yes"}, "stream", "invalid_type"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"logprobs": True}, "logprobs", "unsupported_value"),
])
def test_it_refuses_bad_requests_with_openai_errors(server, body, param, code):
    with pytest.raises(ProtocolError) as refused:
        server.handle("POST", "/v1/chat/completions", {"model": TINY, **CHAT, **body})
    assert (refused.value.param, refused.value.code) == (param, code)
    assert not server.lock.locked()


def test_the_openai_client_works_against_it_with_its_token_and_not_without(server, adapter_dirs):
    http = server.http_server()
    base_url = "http://%s:%d/v1" % http.server_address[:2]
    with http_server.serving(http):
        client = openai.OpenAI(base_url=base_url, api_key="secret", max_retries=0)
        client.post("/adapters", body={"name": "a0", "path": str(adapter_dirs[0])}, cast_to=object)
        assert [model.id for model in client.models.list()] == [TINY, "a0"]
        whole = client.chat.completions.create(model="a0", messages=CHAT["messages"], max_tokens=6, temperature=0)
        streamed = client.chat.completions.create(model="a0", messages=CHAT["messages"], max_tokens=6, temperature=0, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == whole.choices[0].message.content
        completion = client.completions.create(model=TINY, prompt="abc", max_tokens=3, temperature=0)
        assert completion.usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model="a9", messages=CHAT["messages"])
        assert missing.value.code == "model_not_found"
