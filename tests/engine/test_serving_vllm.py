"""The serving role on vLLM's CPU build (engine/serving_vllm.py): the same greedy answers as the
transformers backend for the base model and each adapter, tokens streamed one by one, adapters
added to and removed from vLLM with the least recently used unloaded first, and a rank above what
vLLM was started for refused. One vLLM engine for the module (it starts in tens of seconds)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.config import vllm_available
from engine.models import context_length, stop_token_ids, tiny_random_llama
from engine.policy import make_trainable
from engine.serving import ServingServer
from engine.serving_protocol import ProtocolError
from engine.serving_transformers import TransformersServing
from engine.serving_vllm import VLLMServing
from tests.support.tiny_lora import TINY, tiny_lora

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

CHAT = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(vLLM's server, transformers' server) on the same tiny model, each with the three adapters
    a0, a1, a2 registered (not loaded), at most two loaded at once."""
    root = tmp_path_factory.mktemp("serving-vllm")
    model, tokenizer = tiny_random_llama()
    model.save_pretrained(root / "model", safe_serialization=True)
    for index, (fill, seed) in enumerate(((0.5, 0), (-0.5, 3), (0.3, 1))):  # four distinct greedy answers
        tiny_lora(fill, seed)[0].save_pretrained(root / f"a{index}")
    stops = stop_token_ids(model, tokenizer)
    vllm = VLLMServing(root / "model", max_model_len=256, stop_token_ids=stops, workdir=root, max_adapters=2, max_lora_rank=4, dtype="float32")
    common = {"tokenizer": tokenizer, "served_model": TINY, "max_model_len": min(256, context_length(model)), "max_adapters": 2}
    pair = (ServingServer(backend=vllm, **common), ServingServer(backend=TransformersServing(model, stop_token_ids=stops), **common))
    for server in pair:
        for index in range(3):
            server.handle("POST", "/v1/adapters", {"name": f"a{index}", "path": str(root / f"a{index}"), "load": False})
    yield pair
    vllm.close()


def content(server, model: str) -> str:
    return server.handle("POST", "/v1/chat/completions", {"model": model, **CHAT})[1]["choices"][0]["message"]["content"]


def test_greedy_answers_are_the_transformers_backends_for_the_base_and_each_adapter(servers):
    vllm, reference = servers
    answers = {model: content(vllm, model) for model in (TINY, "a0", "a1", "a2")}
    assert answers == {model: content(reference, model) for model in answers}
    assert len(set(answers.values())) == 4


def test_it_streams_one_chunk_per_token_and_reports_the_usage(servers):
    vllm, _ = servers
    whole = vllm.handle("POST", "/v1/chat/completions", {"model": "a1", **CHAT})[1]
    _, stream = vllm.handle("POST", "/v1/chat/completions", {"model": "a1", **CHAT, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(frame.decode()[6:]) for frame in stream if frame != b"data: [DONE]\n\n"]
    deltas = [chunk["choices"][0]["delta"].get("content") for chunk in chunks[1:-2]]
    assert "".join(deltas) == whole["choices"][0]["message"]["content"]
    assert len(deltas) == whole["usage"]["completion_tokens"]  # one chunk per sampled token (none is a stop token here)
    assert chunks[-1]["usage"] == whole["usage"]


def test_at_most_two_adapters_are_in_vllm_and_the_least_recently_used_goes(servers):
    vllm, _ = servers
    for model in ("a0", "a1", "a0", "a2"):
        content(vllm, model)
    assert vllm.health()["adapters"]["resident"] == ["a0", "a2"]
    assert sorted(vllm.backend.adapters) == ["a0", "a2"]
    assert content(vllm, "a1") == content(servers[1], "a1")  # added again, the same weights


def test_an_adapter_of_a_higher_rank_than_vllm_takes_is_refused(servers, tmp_path):
    vllm, _ = servers
    base, _ = tiny_random_llama()
    wide = make_trainable(base, lora_rank=16, lora_alpha=16, base_model_id=TINY)
    with torch.no_grad():
        for name, parameter in wide.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.1)
    wide.save_pretrained(tmp_path / "wide")
    with pytest.raises(ProtocolError) as refused:
        vllm.handle("POST", "/v1/adapters", {"name": "wide", "path": str(tmp_path / "wide")})
    assert refused.value.code == "adapter_load_failed" and "rank 16" in str(refused.value)
    assert "wide" not in vllm.health()["adapters"]["registered"]
