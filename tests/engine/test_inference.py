"""The inference role's HTTP server (engine.inference) on the tiny model with the transformers backend.

The wire formats are those of vLLM's server as verifiers' train client reads them
(renderers 0.1.12 `renderers.client`: `GET /v1/models` for `max_model_len`, then
`POST /inference/v1/generate`, whose logprobs must name each token `token_id:<id>`).
"""

import json

import httpx
import pytest
import torch
from safetensors.torch import save_file

from engine.grpo import token_logprobs_and_entropy
from engine.inference import MAX_BODY_BYTES, build_server
from engine.policy import completion_logits, pack_rollouts
from tests.support import http_server

MODEL = "lab/tiny-random-llama"


@pytest.fixture
def served(tmp_path):
    server = build_server(MODEL, backend_name="transformers", workdir=tmp_path, model_dir=tmp_path / "models")
    http = server.http_server("127.0.0.1", 0)
    http_server.start(http)
    with httpx.Client(base_url=f"http://127.0.0.1:{http.server_address[1]}", timeout=60) as client:
        yield server, client
    http_server.stop(http)


def prompt_ids(server, text="reverse: abc"):
    return server.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False)


def parse_generate_logprobs(choice):
    """What renderers' _parse_completion_logprobs accepts: one entry per token, named token_id:<id>."""
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"])
    for token, entry in zip(choice["token_ids"], content):
        assert entry["token"] == f"token_id:{token}"
        assert isinstance(entry["logprob"], float)
    return [entry["logprob"] for entry in content]


def test_it_serves_the_model_card_with_max_model_len(served):
    server, client = served
    for path in ("/models", "/v1/models"):
        answer = client.get(path)
        assert answer.status_code == 200
        (card,) = answer.json()["data"]
        assert card["id"] == MODEL and card["max_model_len"] == 512 and card["policy_version"] == 0
        assert card["object"] == "model"


def test_it_generates_token_in_token_out_with_the_sampled_tokens_logprobs(served):
    server, client = served
    prompt = prompt_ids(server)
    body = {"model": MODEL, "token_ids": prompt, "sampling_params": {
        "max_tokens": 8, "temperature": 0.8, "n": 3, "seed": 11, "stop_token_ids": [server.tokenizer.eos_token_id],
        "logprobs": 1, "skip_special_tokens": False,
    }}
    answer = client.post("/inference/v1/generate", json=body)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["prompt_token_ids"] == prompt and data["policy_version"] == 0 and data["model"] == MODEL
    assert len(data["choices"]) == 3
    choices = data["choices"]
    packed = pack_rollouts([prompt], [c["token_ids"] for c in choices], 3, server.tokenizer.pad_token_id)
    with torch.no_grad():
        scored, _ = token_logprobs_and_entropy(completion_logits(server.backend.model, packed), packed.completion_ids, 0.8)
    for row, choice in enumerate(choices):
        logprobs = parse_generate_logprobs(choice)
        assert 1 <= len(choice["token_ids"]) <= 8
        assert choice["finish_reason"] == ("stop" if choice["token_ids"][-1] == server.tokenizer.eos_token_id else "length")
        assert torch.allclose(scored[row, : len(logprobs)], torch.tensor(logprobs), atol=1e-5)
    assert client.post("/inference/v1/generate", json=body).json()["choices"] == choices  # same seed, same samples


def test_it_answers_openai_completions_and_chat_completions_with_logprobs_and_token_ids(served):
    server, client = served
    answer = client.post("/v1/completions", json={"model": MODEL, "prompt": "abc", "max_tokens": 5, "logprobs": 0, "seed": 1})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["object"] == "text_completion" and data["prompt_token_ids"] == server.tokenizer("abc", add_special_tokens=False)["input_ids"]
    (choice,) = data["choices"]
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"]) == len(choice["logprobs"]["tokens"])
    assert choice["text"] == server.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": len(choice["token_ids"]), "total_tokens": 3 + len(choice["token_ids"])}

    messages = [{"role": "user", "content": "reverse: abc"}]
    answer = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_completion_tokens": 6, "logprobs": True, "n": 2, "seed": 3})
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["object"] == "chat.completion" and data["prompt_token_ids"] == prompt_ids(server)
    assert len(data["choices"]) == 2
    for choice in data["choices"]:
        assert choice["message"]["role"] == "assistant"
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        assert choice["finish_reason"] in ("stop", "length")
    plain = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 2}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_it_loads_weights_tagged_with_a_policy_version(served, tmp_path):
    server, client = served
    prompt = prompt_ids(server)
    greedy = {"model": MODEL, "token_ids": prompt, "sampling_params": {"max_tokens": 8, "temperature": 0}}
    before = client.post("/inference/v1/generate", json=greedy).json()
    name = "model.layers.0.self_attn.o_proj.weight"
    weights = tmp_path / "policy-3"
    weights.mkdir()
    save_file({name: server.backend.model.get_parameter(name).detach() * 20}, str(weights / "model.safetensors"))
    answer = client.post("/update_weights", json={"weights_path": str(weights), "policy_version": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"policy_version": 3}
    after = client.post("/inference/v1/generate", json=greedy).json()
    assert after["policy_version"] == 3
    assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
    assert client.get("/health").json() == {"status": "ok", "policy_version": 3, "backend": "transformers", "weights": "merged"}

    stale = client.post("/update_weights", json={"weights_path": str(weights), "policy_version": 2})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_policy_version"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    save_file({"no.such.weight": torch.zeros(2)}, str(foreign / "model.safetensors"))
    refused = client.post("/update_weights", json={"weights_path": str(foreign), "policy_version": 9})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "weights_path"
    missing = client.post("/update_weights", json={"weights_path": str(tmp_path / "nowhere"), "policy_version": 9})
    assert missing.status_code == 400
    # A LoRA adapter needs the vLLM backend (engine.vllm_backend.VLLMBackend.load_adapter).
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    not_taken = client.post("/update_weights", json={"weights_path": str(adapter), "policy_version": 9})
    assert not_taken.status_code == 400 and "takes merged weights, not a LoRA adapter" in not_taken.json()["error"]["message"]
    not_a_flag = client.post("/update_weights", json={"weights_path": str(weights), "policy_version": 1, "restart": "yes"})
    assert not_a_flag.status_code == 400 and not_a_flag.json()["error"]["param"] == "restart"
    assert client.get("/health").json()["policy_version"] == 3  # nothing changed
    assert client.post("/inference/v1/generate", json=greedy).json()["choices"] == after["choices"]
    # A new trainer session (docs/engine.md "Three roles") starts over below the loaded version.
    restarted = client.post("/update_weights", json={"weights_path": str(weights), "policy_version": 1, "restart": True})
    assert restarted.status_code == 200 and restarted.json() == {"policy_version": 1}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/inference/v1/generate", {"model": MODEL, "token_ids": []}, 400, "token_ids"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1, 10**9]}, 400, "token_ids.1"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1, "a"]}, 400, "token_ids"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": {"max_tokens": 10**6}}, 400, "sampling_params.max_tokens"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": {"temperature": "hot"}}, 400, "sampling_params.temperature"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": {"n": 1000}}, 400, "sampling_params.n"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": {"logprobs": 5}}, 400, "sampling_params.logprobs"),
        ("/inference/v1/generate", {"model": MODEL, "token_ids": [1], "sampling_params": []}, 400, "sampling_params"),
        ("/inference/v1/generate", {"model": "someone/else", "token_ids": [1]}, 404, "model"),
        ("/inference/v1/generate", [1, 2], 400, None),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
        ("/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": 5}, 400, "logprobs"),
        ("/update_weights", {"weights_path": "/tmp"}, 400, "policy_version"),
        ("/nowhere", {}, 404, None),
    ],
)
def test_it_refuses_bad_requests_with_openai_error_bodies(served, path, body, status, param):
    _, client = served
    answer = client.post(path, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_it_refuses_malformed_and_oversized_bodies(served):
    _, client = served
    malformed = client.post("/inference/v1/generate", content=b"{not json", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    oversized = client.post("/inference/v1/generate", content=b"[" + b"1," * (MAX_BODY_BYTES // 2) + b"1]")
    assert oversized.status_code == 413
    assert client.get("/v1/models").status_code == 200  # still serving
    assert client.get("/inference/v1/generate").status_code == 405
    assert json.loads(client.get("/health").text)["status"] == "ok"
