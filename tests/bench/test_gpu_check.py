"""bench/gpu_check.py, the engine's GPU check, run on CPU so that it cannot rot between GPU
machines: its smoke run (`--smoke`: a tiny Qwen2-shaped model, one timed step) prints every
figure by name and unit, with a value for what ran and a `not_run` reason for what could not;
its spec without labsdk (`FallbackSpec`, for a GPU machine without pydantic) has every field and
answers every method the engine calls as labsdk's own spec does; with no CUDA device and no `--smoke` it
says it did not run and exits 0 (as `make bench` runs it on a CPU machine); and (marked `real_model`:
two vLLM engines start on CPU) its vLLM part loads merged weights and a LoRA adapter."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "bench" / "gpu_check.py"


def load_gpu_check():
    module_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def run_script(tmp_path, *arguments, timeout=300):
    """Run the script; return its JSON lines by name (stdout holds nothing else)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model-dir", str(tmp_path / "models"), *arguments],
        check=False, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    by_name = {line["name"]: line for line in lines}
    assert len(by_name) == len(lines), "a figure was printed twice"
    return by_name


def assert_ran(line, unit, device="cpu"):
    assert line["unit"] == unit and line["device"] == device and "not_run" not in line, line
    assert isinstance(line["value"], float) and line["value"] > 0, line


def assert_not_run(line, unit, reason):
    assert line["unit"] == unit and line["value"] is None and reason in line["not_run"], line


def same_fields(real, fallback, where="spec"):
    """Assert that `fallback` has every field of the pydantic model `real`, recursively, with equal values."""
    from pydantic import BaseModel

    if isinstance(real, BaseModel):
        assert not real.model_extra, f"{where}: extra keys {real.model_extra} are not modelled"
        for name in type(real).model_fields:
            assert hasattr(fallback, name), f"{where}.{name} is missing from the fallback spec"
            same_fields(getattr(real, name), getattr(fallback, name), f"{where}.{name}")
    elif isinstance(real, list):
        assert isinstance(fallback, list) and len(fallback) == len(real), where
        for index, (one, other) in enumerate(zip(real, fallback)):
            same_fields(one, other, f"{where}[{index}]")
    else:
        assert fallback == real and type(fallback) is type(real), f"{where}: {fallback!r} != {real!r}"


def test_without_cuda_it_says_it_did_not_run_and_exits_0(tmp_path, monkeypatch):
    """What `make bench` runs on a CPU machine (no `--smoke`): one not_run line, exit status 0
    (run_script asserts it), so the benchmarks after it still run; no model is built."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    lines = run_script(tmp_path)

    assert lines == {"gpu_check": {
        "name": "gpu_check", "value": None, "unit": None, "device": "cpu", "baseline": None, "ratio": None,
        "parts": ["trainer", "vllm", "distributed"],
        "not_run": "no CUDA device: bash bench/gpu_check.sh runs it on a GPU machine; --smoke runs it on CPU",
    }}
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("lora_rank", [16, 0])
def test_it_builds_the_same_spec_without_labsdk(lora_rank):
    from engine.config import EngineConfig

    gpu_check = load_gpu_check()
    job = gpu_check.job_spec(gpu_check.SMOKE_MODEL_ID, steps=3, lora_rank=lora_rank, batch_size=8, rollouts_per_example=4,
                             max_tokens=8, env_args={"min_length": 2, "max_length": 4})
    real, real_source = gpu_check.build_spec(job)
    fallback, fallback_source = gpu_check.build_spec(job, fallback=True)

    assert (real_source, fallback_source) == ("labsdk", "fallback")
    assert type(fallback).__name__ == "FallbackSpec"
    same_fields(real, fallback)
    # The methods and properties the engine calls.
    assert fallback.model_dump(mode="json", exclude_none=True) == real.model_dump(mode="json", exclude_none=True)
    assert fallback.sampling.temperature_at(2, 4) == real.sampling.temperature_at(2, 4) == 1.0
    assert fallback.sampling.sampling_params() == real.sampling.sampling_params() == {}
    assert fallback.sampling.chat_template_kwargs() == real.sampling.chat_template_kwargs() == {}
    assert fallback.sampling.unknown_extra_body_keys() == real.sampling.unknown_extra_body_keys() == []
    assert fallback.env[0].rollout_retries == real.env[0].rollout_retries == 0
    assert fallback.eval.evaluates_base_model is real.eval.evaluates_base_model is False
    for slot in ("pre_batch_filters", "post_batch_filters"):
        assert [(f.type, f.enforced, f.settings()) for f in fallback.batch_filters(slot)] == \
               [(f.type, f.enforced, f.settings()) for f in real.batch_filters(slot)] == []
    assert EngineConfig(spec=fallback).digest() == EngineConfig(spec=real).digest()


def test_its_fallback_spec_keeps_labsdk_defaults_when_a_key_is_left_out():
    """A slot left out takes labsdk's default filter (zero_advantage) in both."""
    gpu_check = load_gpu_check()
    job = {"model": gpu_check.SMOKE_MODEL_ID, "env": [{"id": "lab/reverse-text", "args": {}}]}
    real, _ = gpu_check.build_spec(job)
    fallback, _ = gpu_check.build_spec(job, fallback=True)

    same_fields(real, fallback)
    assert [(f.type, f.enforced, f.settings()) for f in fallback.batch_filters("pre_batch_filters")] == \
           [(f.type, f.enforced, f.settings()) for f in real.batch_filters("pre_batch_filters")] == \
           [("zero_advantage", True, {"tolerance": 1e-6})]


def test_its_fallback_spec_refuses_what_it_does_not_model():
    gpu_check = load_gpu_check()
    job = {"model": gpu_check.SMOKE_MODEL_ID, "env": [{"id": "lab/reverse-text", "args": {}}]}

    for extra in ({"val": {"interval": 2}}, {"sampling": {"extra_body": {"top_p": 0.9}}}, {"adapters": {"interval": 1}},
                  {"pre_batch_filters": [{"type": "gibberish"}]}, {"env": [{"id": "lab/reverse-text", "ratio": 2.0}]}):
        with pytest.raises(ValueError, match="does not model"):
            gpu_check.fallback_spec({**job, **extra})


def test_the_smoke_run_prints_every_figure_and_why_the_rest_did_not_run(tmp_path):
    """The trainer part on the fallback spec (what a GPU machine without pydantic builds); the
    distributed part's 2 gloo ranks (a full fine-tune, sharded by both) read their spec through
    labsdk (python -m engine run)."""
    lines = run_script(tmp_path, "--smoke", "--spec-fallback")

    assert lines["gpu_model_parameters"]["value"] == 80704.0  # the tiny Qwen2 shape, built on first use
    for mode in ("lora16", "full"):
        for name, unit in (("gpu_trainer_tokens_per_s", "tokens/s"), ("gpu_generation_tokens_per_s", "tokens/s"),
                           ("gpu_step_s", "s")):
            line = lines[f"{name}_{mode}"]
            assert_ran(line, unit)
            assert line["spec"] == "fallback" and line["steps_timed"] == 1
        assert_not_run(lines[f"gpu_peak_memory_gb_{mode}"], "GiB", "no CUDA device")
    for name, unit in (("gpu_vllm_generation_tokens_per_s", "tokens/s"), ("gpu_vllm_weight_reload_s", "s"),
                       ("gpu_vllm_adapter_load_s", "s"), ("gpu_vllm_lora_generation_tokens_per_s", "tokens/s")):
        assert_not_run(lines[name], unit, "smoke run")
    for mode in ("lora16", "full"):
        assert_not_run(lines[f"gpu_distributed_nccl_step_s_{mode}"], "s", "NCCL needs a GPU per rank")
    line = lines["distributed_gloo_step_s_full"]
    assert_ran(line, "s")
    assert (line["backend"], line["world_size"], line["rank1_trained"], line["fsdp2_ranks"]) == ("gloo", 2, True, 2)
    assert_not_run(lines["distributed_gloo_step_s_lora"], "s", "test_distributed.py")
    assert len(lines) == 1 + 4 * 2 + 4 + 2 + 2


@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_its_vllm_part_loads_merged_weights_and_a_lora_adapter_on_cpu(tmp_path):
    """Two vLLM engines start on CPU (eager), about a minute or more here: `real_model`, out of `make test`."""
    lines = run_script(tmp_path, "--smoke", "--parts", "vllm", timeout=600)

    assert_ran(lines["gpu_vllm_generation_tokens_per_s"], "tokens/s")
    assert_ran(lines["gpu_vllm_weight_reload_s"], "s")
    assert lines["gpu_vllm_weight_reload_s"]["policy_version"] == 1
    for name, unit in (("gpu_vllm_adapter_load_s", "s"), ("gpu_vllm_lora_generation_tokens_per_s", "tokens/s")):
        line = lines[name]
        assert_ran(line, unit)
        assert (line["policy_version"], line["max_lora_rank"], line["weights_format"]) == (7, 16, "lora")
