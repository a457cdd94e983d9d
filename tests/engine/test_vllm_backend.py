"""The vLLM rollout backend on vLLM's CPU build: sampling, log-probabilities, weight reloads,
LoRA adapters per step, a job.

vLLM starts an engine process (about 20–40 s on 2 cores even in eager mode), so the backend
tests share one engine, started with LoRA so that it takes both merged weights and adapters,
and everything here carries the `e2e` marker.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from engine.grpo import token_logprobs_and_entropy
from engine.models import tiny_random_llama
from engine.policy import (
    completion_logits,
    make_trainable,
    pack_rollouts,
    policy_adapter,
    policy_weights,
    rollout_policy,
)
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
    """The tiny model, its tokenizer, and one fp32 vLLM engine on its weights, with LoRA for
    adapters of rank 4 (vLLM's max_lora_rank 8)."""
    workdir = tmp_path_factory.mktemp("vllm")
    model, tokenizer = tiny_random_llama()
    model.save_pretrained(workdir / "model", safe_serialization=True)
    backend = VLLMBackend(
        workdir / "model", seed=0, max_model_len=256, stop_token_ids=[tokenizer.eos_token_id],
        workdir=workdir, dtype="float32", kv_cache_gb=1, max_lora_rank=4,
    )
    assert (backend.weights_format, backend.max_lora_rank) == ("lora", 8)
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


def trained_adapter(seed):
    """A LoRA policy of rank 4 on the tiny model whose B matrices are random (as after training)."""
    model, _ = tiny_random_llama()
    policy = make_trainable(model, lora_rank=4, lora_alpha=8, base_model_id="lab/tiny-random-llama")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return policy.eval()


def test_it_applies_a_lora_adapter_per_step_with_the_trainers_log_probabilities(tiny):
    model, tokenizer, backend = tiny
    prompts = prompts_of(tokenizer, 4)
    sampling = dict(n=3, max_tokens=12, temperature=0.7, seed=5)
    base = backend.generate(prompts, **sampling)
    first = trained_adapter(1)

    backend.load_adapter(policy_adapter(first), policy_version=1)
    assert backend.lora_request.lora_name == "policy-1"
    adapted = backend.generate(prompts, **sampling)
    assert {c.policy_version for c in adapted} == {1}
    assert [c.token_ids for c in adapted] != [c.token_ids for c in base]  # the adapter is applied
    packed = pack_rollouts(prompts, [c.token_ids for c in adapted], 3, tokenizer.pad_token_id)
    with torch.no_grad():
        scored, _ = token_logprobs_and_entropy(completion_logits(first, packed), packed.completion_ids, 0.7)
    for row, completion in enumerate(adapted):
        assert torch.allclose(scored[row, : len(completion.token_ids)], torch.tensor(completion.logprobs), atol=1e-4)

    # The same policy as merged weights samples the same completions with the same log-probabilities.
    backend.load_weights(policy_weights(first), policy_version=2)
    assert backend.lora_request is None and not backend.llm.llm_engine.list_loras()
    merged = backend.generate(prompts, **sampling)
    assert [c.token_ids for c in merged] == [c.token_ids for c in adapted]
    for merged_one, adapted_one in zip(merged, adapted):
        assert torch.allclose(torch.tensor(merged_one.logprobs), torch.tensor(adapted_one.logprobs), atol=1e-4)

    # An engine that takes merged weights only merges an adapter itself: the same policy again.
    backend.weights_format = "merged"
    try:
        backend.load_adapter(policy_adapter(first), policy_version=3)
    finally:
        backend.weights_format = "lora"
    assert backend.lora_request is None
    assert [c.token_ids for c in backend.generate(prompts, **sampling)] == [c.token_ids for c in adapted]

    # An adapter after merged weights applies to the base weights again; a later version's
    # adapter changes the samples, and replaces the earlier one in vLLM.
    backend.load_adapter(policy_adapter(first), policy_version=3)
    assert [c.token_ids for c in backend.generate(prompts, **sampling)] == [c.token_ids for c in adapted]
    later = trained_adapter(2)
    backend.load_adapter(policy_adapter(later), policy_version=4)
    greedy = dict(n=1, max_tokens=10, temperature=0.0, seed=0)
    sampled = backend.generate(prompts, **greedy)
    assert {c.policy_version for c in sampled} == {4}
    reference = TransformersBackend(rollout_policy(later), pad_token_id=tokenizer.pad_token_id, stop_token_ids=[tokenizer.eos_token_id])
    assert [c.token_ids for c in sampled] == [c.token_ids for c in reference.generate(prompts, **greedy)]
    assert len(backend.llm.llm_engine.list_loras()) == 1 and backend.lora_request.lora_name == "policy-4"
    assert len(list(backend._weights_dir.glob("adapter-*"))) == 1  # earlier adapters' files are removed
    with pytest.raises(ValueError, match="holds no adapter_config.json"):
        backend.load_adapter(backend._weights_dir, policy_version=5)
    assert backend.policy_version == 4

    backend.load_weights([], policy_version=5)  # back to the base model for the tests below
    assert [c.token_ids for c in backend.generate(prompts, **sampling)] == [c.token_ids for c in base]


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


def on_policy_points(workdir):
    """step → metric values of an offline run's training steps."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return {p["step"]: p["values"] for p in map(json.loads, lines) if "loss/mean" in p["values"]}


# As three roles it starts vLLM once more, as test_three_roles_on_vllm_with_async_on_resume_exactly
# does with merged weights: minutes on 2 cores, so make test runs it in one process only.
@pytest.mark.parametrize("roles", ["local", pytest.param("process", marks=pytest.mark.real_model)])
def test_a_lora_job_samples_each_step_with_its_adapter_through_vllm(tmp_path, roles):
    """LAB_ENGINE_VLLM_WEIGHTS=lora on CPU, synchronous steps in fp32: in one process (the trainer
    hands vLLM its adapter) and as three roles (the trainer publishes the adapter to the shared
    directory, the orchestrator has the inference role load it). Every step samples with the
    adapter of the updates before it, and the trainer's log-probabilities of the sampled tokens
    agree with vLLM's: the importance ratio's KL estimate stays at rounding level."""
    from tests.support.engine_roles import engine, finished

    spec = write_spec(tmp_path / "spec.json", max_steps=5, seed=3, checkpoints={"interval": 0, "keep_last": 1})
    env = {"LAB_ENGINE_ROLLOUT": "vllm", "LAB_ENGINE_VLLM_DTYPE": "float32", "LAB_ENGINE_VLLM_WEIGHTS": "lora",
           "LAB_ENGINE_OVERLAP": "0", "LAB_ENGINE_ROLES": roles}
    code, stderr = finished(engine(tmp_path, spec, env), timeout=600)
    assert code == 0, stderr[-3000:]
    points = on_policy_points(tmp_path / "work")
    assert sorted(points) == [1, 2, 3, 4, 5]
    # The adapter trained (a step's groups had different rewards) before the last step, which
    # then sampled with an adapter whose B matrices are no longer zero.
    trained = [step for step, values in points.items() if values["optim/grad_norm"] > 0]
    assert trained and trained[0] < 5 and "mismatch_kl/mean" in points[5], points
    for step, values in points.items():
        assert values["off_policy/steps_max"] == 0.0
        # k3 ≈ Δ²/2 per token: under 1e-9 means log-probabilities within about 4e-5 of each other.
        assert 0.0 <= values.get("mismatch_kl/mean", 0.0) < 1e-9, (step, values)
    if roles == "local":
        assert "weights: LoRA adapter, max_lora_rank 8" in stderr
    else:
        log = (tmp_path / "work" / "inference" / "inference.log").read_text()
        assert [int(v) for v in re.findall(r"loaded policy version (\d+) from \S+ \(LoRA adapter, rank 4\)", log)] == [0, 1, 2, 3, 4]


def test_the_inference_role_serves_vllm_over_http_and_loads_tagged_weights_and_adapters(tmp_path):
    import signal
    import socket

    import httpx
    from safetensors.torch import save_file

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = {
        **os.environ, "LAB_MODEL_DIR": str(tmp_path / "models"), "LAB_ENGINE_VLLM_DTYPE": "float32",
        "LAB_ENGINE_VLLM_WEIGHTS": "lora", "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'sdk'}",
    }
    command = [sys.executable, "-m", "engine", "inference", "--model", "lab/tiny-random-llama", "--backend", "vllm",
               "--port", str(port), "--workdir", str(tmp_path / "work"), "--max-lora-rank", "4"]
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
            assert client.get("/health").json() == {"status": "ok", "policy_version": 0, "backend": "vllm", "weights": "lora"}
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

            # A peft adapter directory at the same route: applied to the base weights by vLLM's LoRA path.
            policy = trained_adapter(2)
            policy_adapter(policy).save(tmp_path / "policy-2")
            assert client.post("/update_weights", json={"weights_path": str(tmp_path / "policy-2"), "policy_version": 2}).json() == {"policy_version": 2}
            adapted = client.post("/inference/v1/generate", json=greedy).json()
            reference = TransformersBackend(rollout_policy(policy), pad_token_id=tokenizer.pad_token_id, stop_token_ids=[tokenizer.eos_token_id])
            (expected,) = reference.generate([prompt], n=1, max_tokens=8, temperature=0.0, seed=0)
            assert adapted["policy_version"] == 2 and adapted["choices"][0]["token_ids"] == expected.token_ids != before["choices"][0]["token_ids"]
            (tmp_path / "policy-3").mkdir()
            (tmp_path / "policy-3" / "adapter_config.json").write_text("{}")
            refused = client.post("/update_weights", json={"weights_path": str(tmp_path / "policy-3"), "policy_version": 3})
            assert refused.status_code == 400 and "not a LoRA adapter config" in refused.json()["error"]["message"]
            assert client.get("/health").json()["policy_version"] == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.real_model  # starts vLLM twice (a run, then its resume)
def test_three_roles_on_vllm_with_async_on_resume_exactly(tmp_path):
    """The inference role on vLLM (fp32), sampling two steps ahead for the orchestrator role: a
    run resumed from its step-2 checkpoint (which holds the batches of steps 3 and 4) reports
    steps 3 and 4 exactly as the uninterrupted run did, each step once."""
    from tests.support.engine_roles import SPEC, engine, finished, points

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
