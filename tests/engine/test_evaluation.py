"""The engine's evaluation run (engine/evaluation.py) in this process on the tiny model: every
(environment, example, rollout) scored and reported once, in a seeded order a rerun repeats, the
whole eval split for "all", a checkpoint's weights, an adapter artifact's, an environment whose
code fails, a stop, nucleus sampling on the transformers backend, and an OpenAI-compatible
endpoint sampled instead of a model (a real local HTTP server: engine/endpoint_sampling.py)."""

from __future__ import annotations

import json

import pytest
import torch

from engine.endpoint_sampling import EndpointRefused
from engine.environments import EnvironmentFailed, load_environment
from engine.environments.addition import Addition
from engine.evaluation import PROMPTS_PER_CALL, Evaluator, call_seed
from engine.models import load_model
from engine.reporter import OfflineTransport, Reporter
from engine.rollout import nucleus
from tests.engine.conftest import engine_config, tiny_spec
from tests.support.engine import train
from tests.support.openai_server import openai_server, usage_of
from tests.support.tiny_lora import tiny_lora

EVALUATION = {
    "max_steps": 1,
    "env": [{"id": "lab/addition", "args": {"max_operand": 9}}],
    "seed": 5,
    "eval": {
        "interval": 0,
        "env": [
            {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2},
            {"id": "lab/reverse-text", "args": {"min_length": 2, "max_length": 4}, "num_examples": 2, "rollouts_per_example": 1},
        ],
        "sampling": {"max_tokens": 5, "temperature": 0.8, "extra_body": {"top_p": 0.9}},
    },
}


def evaluate(workdir, spec: dict, init_dir=None, stop: bool = False) -> tuple[str, list[dict], Evaluator]:
    """Run an evaluation offline under ``workdir``; return its outcome, its samples and the evaluator."""
    reporter = Reporter(OfflineTransport(workdir), job_id="job_1", attempt=1, spool_dir=workdir / "spool", heartbeat_interval=60)
    reporter.start()
    evaluator = Evaluator(config=engine_config(spec), workdir=workdir, reporter=reporter)
    if stop:
        evaluator.stop_event.set()
    try:
        evaluator.setup(init_dir)
        outcome = evaluator.run()
    finally:
        evaluator.close()
        reporter.close(None, timeout=10)
    path = workdir / "evaluation-samples.jsonl"
    samples = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return outcome, samples, evaluator


def test_every_rollout_is_scored_and_reported_once_in_a_seeded_order(tmp_path):
    outcome, samples, evaluator = evaluate(tmp_path / "first", tiny_spec(**EVALUATION))
    assert outcome == "succeeded"
    assert [(s["environment"], s["example"], s["rollout"], s["num_examples"]) for s in samples] == [
        (0, 0, 0, 3), (0, 0, 1, 3), (0, 1, 0, 3), (0, 1, 1, 3), (0, 2, 0, 3), (0, 2, 1, 3), (1, 0, 0, 2), (1, 1, 0, 2),
    ]
    addition = evaluator.orchestrator.eval_targets[0].environment
    for s in samples[:6]:
        example = addition.example(s["example"], "eval")
        assert (s["prompt"], s["answer"], s["info"]) == (example.messages, example.answer, example.info)
        assert set(s["functions"]) == {"correct", "answer_only"}
        assert s["reward"] == s["functions"]["correct"]  # its weight 1, answer_only's 0
        assert 1 <= s["completion_tokens"] <= 5 and s["prompt_tokens"] > 0 and s["latency_s"] > 0
        assert s["attempt"] == 1 and not s["timed_out"] and "error" not in s
    _, again, _ = evaluate(tmp_path / "again", tiny_spec(**EVALUATION))
    strip = lambda rows: [{k: v for k, v in row.items() if k != "latency_s"} for row in rows]  # noqa: E731
    assert strip(again) == strip(samples)
    other_seed, _, _ = evaluate(tmp_path / "other", tiny_spec(**{**EVALUATION, "seed": 6}))
    assert other_seed == "succeeded"
    assert call_seed(5, 1, 64) == (5 << 24) + (1 << 16) + 64


def test_all_examples_takes_the_environments_whole_eval_split(tmp_path, monkeypatch):
    monkeypatch.setattr(Addition, "eval_size", PROMPTS_PER_CALL + 2)  # two backend calls
    spec = tiny_spec(**{**EVALUATION, "eval": {**EVALUATION["eval"], "env": [{"id": "lab/addition", "num_examples": -1}]}})
    spec["eval"]["sampling"]["max_tokens"] = 1
    _, samples, _ = evaluate(tmp_path, spec)
    assert [(s["example"], s["num_examples"]) for s in samples] == [(index, PROMPTS_PER_CALL + 2) for index in range(PROMPTS_PER_CALL + 2)]


def test_a_checkpoint_is_evaluated_with_its_merged_weights(tmp_path):
    trained = tiny_spec(max_steps=1, learning_rate=0.5, checkpoints={"interval": 1, "keep_last": 1})
    train(tmp_path / "train", engine_config(trained))
    checkpoint = next((tmp_path / "train" / "checkpoints").iterdir())
    spec = tiny_spec(**EVALUATION, lora_rank=trained["lora_rank"], lora_alpha=trained["lora_alpha"])
    _, samples, evaluator = evaluate(tmp_path / "eval", spec, init_dir=checkpoint)
    assert len(samples) == 8
    base, _ = load_model("lab/tiny-random-llama")
    sampler = evaluator.orchestrator.backend.model
    assert not any(hasattr(module, "lora_A") for module in sampler.modules())  # merged, no adapter layers
    changed = [name for name, weight in sampler.state_dict().items() if not torch.equal(weight, base.state_dict()[name])]
    assert changed and all("proj" in name for name in changed)  # LoRA's targets moved, nothing else


def test_a_checkpoint_of_another_rank_does_not_fit(tmp_path):
    trained = tiny_spec(max_steps=1, checkpoints={"interval": 1, "keep_last": 1})
    train(tmp_path / "train", engine_config(trained))
    checkpoint = next((tmp_path / "train" / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="do not fit"):
        evaluate(tmp_path / "eval", tiny_spec(**EVALUATION, lora_rank=8), init_dir=checkpoint)


def test_an_example_whose_environment_code_fails_is_reported_as_errors_alone(tmp_path, monkeypatch):
    score = Addition.score

    def failing(self, completion, example):
        if example.info["operands"] == self.example(1, "eval").info["operands"]:
            raise EnvironmentFailed("the rubric raised")
        return score(self, completion, example)

    monkeypatch.setattr(Addition, "score", failing)
    outcome, samples, _ = evaluate(tmp_path, tiny_spec(**EVALUATION))
    assert outcome == "succeeded"
    assert [(s["example"], s["reward"], s.get("error"), s["completion"] == "") for s in samples[:6]] == [
        (0, samples[0]["reward"], None, False), (0, samples[1]["reward"], None, False),
        (1, 0.0, "the rubric raised", True), (1, 0.0, "the rubric raised", True),
        (2, samples[4]["reward"], None, False), (2, samples[5]["reward"], None, False),
    ]


def test_a_stop_ends_the_run_before_its_next_call(tmp_path):
    outcome, samples, _ = evaluate(tmp_path, tiny_spec(**EVALUATION), stop=True)
    assert (outcome, samples) == ("stopped", [])


def test_nucleus_keeps_the_fewest_likeliest_tokens_reaching_top_p():
    probabilities = torch.tensor([[0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]])
    for top_p, kept in [
        (0.7, [[False, True, True, False], [True, True, True, False]]),
        (0.4, [[False, True, False, False], [True, True, False, False]]),
        (1e-9, [[False, True, False, False], [True, False, False, False]]),
    ]:
        filtered = nucleus(probabilities, top_p)
        assert (filtered > 0).tolist() == kept
        assert torch.equal(filtered[filtered > 0], probabilities[filtered > 0])  # the kept ones as they were


class _Recording:
    """A transport that keeps every body it is sent."""

    def __init__(self):
        self.bodies = []

    def post(self, path, body, *, idempotency_key=None):
        self.bodies.append((path, json.dumps(body)))
        return {"action": "continue"} if path == "status" else {"accepted": len(body.get("samples", []))}


def test_batches_of_large_samples_stay_under_labs_request_limit(tmp_path):
    transport = _Recording()
    reporter = Reporter(transport, job_id="job_1", attempt=1, spool_dir=tmp_path / "spool", heartbeat_interval=60)
    reporter.start()
    reporter.evaluation_samples([{"example": index, "completion": "x" * 200_000} for index in range(10)])
    assert reporter.close(None, timeout=20)
    batches = [json.loads(body) for path, body in transport.bodies if path == "evaluation-samples"]
    assert [sample["example"] for batch in batches for sample in batch["samples"]] == list(range(10))
    assert len(batches) >= 4 and all(len(body) < 1024 * 1024 for path, body in transport.bodies)


ENDPOINT_EVALUATION = {
    **EVALUATION,
    "eval": {**EVALUATION["eval"], "sampling": {"max_tokens": 7, "temperature": 0.5, "extra_body": {"top_p": 0.9}}},
}


def endpoint_spec(base_url: str, key_var: str = "ACME_KEY") -> dict:
    spec = tiny_spec(**ENDPOINT_EVALUATION)
    spec["eval"] = {**spec["eval"], "endpoint": {"base_url": base_url, "model": "acme/chat", "api_key_var": key_var}}
    return spec


def the_sum(body: dict) -> str:
    """What the server answers: the sum an addition prompt asks for, else the prompt reversed."""
    prompt = body["messages"][-1]["content"]
    numbers = [int(word) for word in prompt.replace("?", " ").split() if word.isdigit()]
    return str(sum(numbers)) if len(numbers) == 2 else prompt[::-1]


def test_an_adapter_artifact_is_evaluated_with_its_weights_merged(tmp_path):
    adapted, _ = tiny_lora(0.5)
    adapted.save_pretrained(tmp_path / "adapter")  # what an adapter artifact holds: no trainer_state/
    spec = tiny_spec(**EVALUATION, lora_rank=4, lora_alpha=8)
    _, samples, evaluator = evaluate(tmp_path / "eval", spec, init_dir=tmp_path / "adapter")
    assert len(samples) == 8
    expected = adapted.merge_and_unload().state_dict()
    sampler = evaluator.orchestrator.backend.model
    assert not any(hasattr(module, "lora_A") for module in sampler.modules())
    assert all(torch.allclose(weight, expected[name], atol=1e-6) for name, weight in sampler.state_dict().items())


def test_an_endpoint_evaluation_samples_each_rollout_through_the_endpoint(tmp_path, monkeypatch):
    with openai_server(the_sum) as server:
        monkeypatch.setenv("ACME_KEY", server.key)
        outcome, samples, evaluator = evaluate(tmp_path / "eval", endpoint_spec(server.base_url))
    assert outcome == "succeeded"
    assert evaluator.orchestrator.backend is None and evaluator.orchestrator.tokenizer is None  # no model loaded
    assert [(s["environment"], s["example"], s["rollout"]) for s in samples] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0), (1, 1, 0),
    ]
    asked = {(tuple(json.dumps(m, sort_keys=True) for m in r["body"]["messages"]), r["body"]["seed"]): r for r in server.requests}
    assert len(server.requests) == len(asked) == 8
    environments = [load_environment("lab/addition", {"max_operand": 9}, 5), load_environment("lab/reverse-text", {"min_length": 2, "max_length": 4}, 5)]
    for sample in samples:
        request = asked[(tuple(json.dumps(m, sort_keys=True) for m in sample["prompt"]), call_seed(5, sample["environment"], sample["example"]) + sample["rollout"])]
        assert request["headers"]["Authorization"] == f"Bearer {server.key}"
        assert {key: request["body"][key] for key in ("model", "n", "max_tokens", "temperature", "top_p")} == {
            "model": "acme/chat", "n": 1, "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        }
        answered = the_sum(request["body"])
        assert sample["completion"] == answered
        usage = usage_of(request["body"], answered)
        assert (sample["prompt_tokens"], sample["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
        environment = environments[sample["environment"]]
        scored = environment.score_rollout(answered, environment.example(sample["example"], "eval"))
        assert sample["reward"] == scored.reward
    assert all(sample["reward"] == 1.0 for sample in samples if sample["environment"] == 0)  # the server adds right


def test_an_endpoint_that_refuses_the_key_is_a_configuration_error(tmp_path, monkeypatch):
    with openai_server(the_sum) as server:
        monkeypatch.setenv("ACME_KEY", "sk-wrong")
        with pytest.raises(EndpointRefused, match="HTTP 401: Incorrect API key provided"):
            evaluate(tmp_path / "eval", endpoint_spec(server.base_url))
        assert len(server.requests) >= 1


def test_a_missing_secret_is_refused_before_any_request(tmp_path, monkeypatch):
    monkeypatch.delenv("ACME_KEY", raising=False)
    with openai_server(the_sum) as server:
        with pytest.raises(EndpointRefused, match="needs the job secret ACME_KEY"):
            evaluate(tmp_path / "eval", endpoint_spec(server.base_url))
        assert server.requests == []
