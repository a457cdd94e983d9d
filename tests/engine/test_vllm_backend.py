"""The vLLM rollout backend on vLLM's CPU build: sampling, log-probabilities, weight reloads, a job.

vLLM starts an engine process (about 20–40 s on 2 cores even in eager mode), so the backend
tests share one engine and everything here carries the `e2e` marker.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from engine.grpo import token_logprobs_and_entropy
from engine.models import tiny_random_llama
from engine.policy import completion_logits, pack_rollouts
from engine.rollout import TransformersBackend
from engine.vllm_backend import VLLMBackend

from .conftest import REPO_ROOT, write_spec

pytestmark = pytest.mark.e2e


def prompts_of(tokenizer, count):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"reverse: {'abcdefgh'[i:] or 'x'}"}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model, its tokenizer, and one fp32 vLLM engine on its weights."""
    workdir = tmp_path_factory.mktemp("vllm")
    model, tokenizer = tiny_random_llama()
    model.save_pretrained(workdir / "model", safe_serialization=True)
    backend = VLLMBackend(
        workdir / "model", seed=0, max_model_len=256, stop_token_ids=[tokenizer.eos_token_id],
        workdir=workdir, dtype="float32", kv_cache_gb=1,
    )
    yield model, tokenizer, backend
    backend.close()


def test_it_returns_the_sampled_tokens_log_probabilities_under_the_trainers_distribution(tiny):
    model, tokenizer, backend = tiny
    prompts = prompts_of(tokenizer, 4)
    completions = backend.generate(prompts, n=3, max_tokens=12, temperature=0.7, seed=5)
    assert len(completions) == 12
    packed = pack_rollouts(prompts, [c.token_ids for c in completions], 3, tokenizer.pad_token_id)
    with torch.no_grad():
        scored, _ = token_logprobs_and_entropy(completion_logits(model, packed), packed.completion_ids, 0.7)
    for row, completion in enumerate(completions):
        assert len(completion.logprobs) == len(completion.token_ids) > 0
        assert completion.truncated == (completion.token_ids[-1] != tokenizer.eos_token_id)
        assert len(completion.token_ids) <= 12
        assert torch.allclose(scored[row, : len(completion.token_ids)], torch.tensor(completion.logprobs), atol=1e-4)
    # The same seed gives the same batch.
    again = backend.generate(prompts, n=3, max_tokens=12, temperature=0.7, seed=5)
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]


def test_it_loads_new_weights_in_place_and_tags_rollouts_with_their_policy_version(tiny):
    model, tokenizer, backend = tiny
    prompts = prompts_of(tokenizer, 6)
    reference = TransformersBackend(model, pad_token_id=tokenizer.pad_token_id, stop_token_ids=[tokenizer.eos_token_id])
    greedy = dict(n=1, max_tokens=10, temperature=0.0, seed=0)
    assert [c.token_ids for c in backend.generate(prompts, **greedy)] == [c.token_ids for c in reference.generate(prompts, **greedy)]

    name = "model.layers.0.self_attn.o_proj.weight"
    original = model.state_dict()[name].clone()
    changed = original * 20
    backend.load_weights([(name, changed)], policy_version=7)
    after = backend.generate(prompts, **greedy)
    with torch.no_grad():
        model.get_parameter(name).copy_(changed)
    try:
        assert [c.token_ids for c in after] == [c.token_ids for c in reference.generate(prompts, **greedy)]
    finally:
        with torch.no_grad():
            model.get_parameter(name).copy_(original)
    assert {c.policy_version for c in after} == {7}

    backend.load_weights([(name, original)], policy_version=8)
    restored = backend.generate(prompts, **greedy)
    assert [c.token_ids for c in restored] == [c.token_ids for c in reference.generate(prompts, **greedy)]
    assert {c.policy_version for c in restored} == {8}
    assert backend.reload_seconds > 0


def test_it_passes_the_specs_extra_sampling_parameters_to_vllm(tiny):
    _, tokenizer, backend = tiny
    prompts = prompts_of(tokenizer, 2)
    greedy = backend.generate(prompts, n=1, max_tokens=8, temperature=0.0, seed=1)
    # top_k = 1 leaves one token to sample: every sample at temperature 1 is the greedy completion.
    top_one = backend.generate(prompts, n=3, max_tokens=8, temperature=1.0, seed=1, sampling_params={"top_k": 1})
    assert [c.token_ids for c in top_one] == [greedy[0].token_ids] * 3 + [greedy[1].token_ids] * 3
    free = backend.generate(prompts, n=3, max_tokens=8, temperature=1.0, seed=1)
    assert [c.token_ids for c in free] != [c.token_ids for c in top_one]
    with pytest.raises(ValueError, match="sets seed itself"):
        backend.generate(prompts, n=1, max_tokens=8, temperature=1.0, seed=1, sampling_params={"seed": 3})


def test_it_refuses_a_weight_the_model_does_not_have(tiny):
    _, _, backend = tiny
    with pytest.raises(KeyError, match="no.such.weight"):
        backend.load_weights([("no.such.weight", torch.zeros(2))], policy_version=99)
    assert backend.policy_version != 99


def test_it_runs_a_tiny_job_reporting_every_step_once(tmp_path, fake_lab):
    spec = write_spec(
        tmp_path / "spec.json", max_steps=4, checkpoints={"interval": 2, "keep_last": 2},
        # extra_body reaches vLLM's SamplingParams for training and (overridden) eval rollouts.
        sampling={"max_tokens": 6, "temperature": 1.0, "extra_body": {"top_k": 50, "min_p": 0.0}},
        eval={"interval": 4, "num_examples": 4, "sampling": {"extra_body": {"top_k": 1}}},
    )
    environment = {
        **os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "LAB_JOB_TOKEN": fake_lab.token,
        "LAB_ENGINE_ROLLOUT": "vllm", "LAB_ENGINE_VLLM_DTYPE": "float32", "LAB_ENGINE_OVERLAP": "1",
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
    }
    command = [sys.executable, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1",
               "--workdir", str(tmp_path / "work"), "--spec", str(spec), "--lab-url", fake_lab.url]
    process = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=400)
    assert process.returncode == 0, process.stderr[-3000:]
    assert fake_lab.finish == [{"attempt": 1, "outcome": "succeeded"}]
    assert fake_lab.metric_arrivals == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}  # step 0: the base model's eval
    assert set(fake_lab.metrics[0]) == {"eval/reverse-text/mean", "eval/reverse-text/lcs_ratio/mean", "eval/reverse-text/exact/mean"}
    for step, values in fake_lab.metrics.items():
        if step == 0:
            continue
        assert values["perf/rollout_backend_vllm"] == 1.0
        assert values["perf/rollout_tokens_per_s"] > 0 and values["time/wait_for_weights"] > 0
        assert values["off_policy/steps_max"] == (0.0 if step == 1 else 1.0)
    # Steps after the first were sampled while the previous step trained: one version behind.
    assert any(values.get("mismatch_kl/mean", 0) > 0 for step, values in fake_lab.metrics.items() if step > 1)
    assert not any("does not take vLLM sampling parameters" in line for line in fake_lab.logs.values())
    assert "eval/reverse-text/mean" in fake_lab.metrics[4]
    assert any(values.get("loss/mean", 0.0) != 0.0 for values in fake_lab.metrics.values())
    assert [c["step"] for c in fake_lab.checkpoints.values()] == [2, 4]
    assert {c["status"] for c in fake_lab.checkpoints.values()} == {"ready"}
    assert any(line.startswith("rollout backend: vllm") for line in fake_lab.logs.values())


def test_the_inference_role_serves_vllm_over_http_and_loads_tagged_weights(tmp_path):
    import signal
    import socket

    import httpx
    from safetensors.torch import save_file

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {
        **os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "LAB_ENGINE_VLLM_DTYPE": "float32",
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
    }
    command = [sys.executable, "-m", "engine", "inference", "--model", "lab/tiny-random-llama", "--backend", "vllm",
               "--port", str(port), "--workdir", str(tmp_path / "work")]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for _ in range(600):
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    assert process.poll() is None, process.stderr.read()[-3000:]
                    time.sleep(0.5)
            assert client.get("/health").json() == {"status": "ok", "policy_version": 0, "backend": "vllm"}
            (card,) = client.get("/v1/models").json()["data"]
            assert card["id"] == "lab/tiny-random-llama" and card["max_model_len"] == 512

            model, tokenizer = tiny_random_llama()
            prompt = prompts_of(tokenizer, 1)[0]
            sampled = client.post("/inference/v1/generate", json={"model": card["id"], "token_ids": prompt, "sampling_params": {
                "max_tokens": 6, "temperature": 1.0, "n": 2, "seed": 4, "logprobs": 1, "skip_special_tokens": False,
                "stop_token_ids": [tokenizer.eos_token_id]}}).json()
            assert sampled["prompt_token_ids"] == prompt and len(sampled["choices"]) == 2
            for choice in sampled["choices"]:
                assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in choice["token_ids"]]

            greedy = {"model": card["id"], "token_ids": prompt, "sampling_params": {"max_tokens": 8, "temperature": 0}}
            before = client.post("/inference/v1/generate", json=greedy).json()
            name = "model.layers.0.self_attn.o_proj.weight"
            (tmp_path / "policy").mkdir()
            save_file({name: model.get_parameter(name).detach() * 20}, str(tmp_path / "policy" / "model.safetensors"))
            assert client.post("/update_weights", json={"weights_path": str(tmp_path / "policy"), "policy_version": 1}).json() == {"policy_version": 1}
            after = client.post("/inference/v1/generate", json=greedy).json()
            assert after["policy_version"] == 1 and after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_three_roles_on_vllm_with_async_on_resume_exactly(tmp_path):
    """The inference role on vLLM (fp32), sampling two steps ahead for the orchestrator role: a
    run resumed from its step-2 checkpoint (which holds the batches of steps 3 and 4) reports
    steps 3 and 4 exactly as the uninterrupted run did, each step once."""
    from tests.engine.test_roles import SPEC, engine, finished, points

    spec = write_spec(tmp_path / "spec.json", **SPEC)
    roles = {"LAB_ENGINE_ROLES": "process", "LAB_ENGINE_ROLLOUT": "vllm", "LAB_ENGINE_VLLM_DTYPE": "float32"}
    code, stderr = finished(engine(tmp_path, spec, roles, workdir="first"))
    assert code == 0, stderr[-3000:]
    first = points(tmp_path / "first")
    assert sorted(first) == [0, 1, 2, 3, 4]
    assert [first[step]["off_policy/steps_max"] for step in (1, 2, 3, 4)] == [0.0, 1.0, 2.0, 2.0]
    assert "loaded policy version 2" in (tmp_path / "first" / "inference" / "inference.log").read_text()
    checkpoint = tmp_path / "first" / "checkpoints" / "step-000002"
    code, stderr = finished(engine(tmp_path, spec, roles, "--resume-from", str(checkpoint), workdir="resumed"))
    assert code == 0, stderr[-3000:]
    assert points(tmp_path / "resumed") == {step: first[step] for step in (3, 4)}
    # Each step's training point once; step 4's eval came after it, as a point Lab merges into it.
    reported = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(p["step"] for p in reported if "loss/mean" in p["values"]) == [3, 4]
    assert [sorted(p["values"]) for p in reported if "loss/mean" not in p["values"]] == [
        ["eval/reverse-text/exact/mean", "eval/reverse-text/lcs_ratio/mean", "eval/reverse-text/mean"]
    ]
