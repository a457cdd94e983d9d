"""The example job specs in examples/ are valid against the spec model and the catalogues."""

import pytest

from engine.cli import load_config

from .conftest import REPO_ROOT

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*-tiny.toml")) + sorted((REPO_ROOT / "examples").glob("*-smollm2.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_it_accepts_the_example_specs(path):
    config, warnings = load_config(path)
    assert warnings == []
    assert config.batch_size % config.rollouts_per_example == 0


def test_it_has_the_main_job_settings():
    config, _ = load_config(REPO_ROOT / "examples" / "addition-smollm2.toml")
    assert (config.model, config.max_steps, config.batch_size, config.max_tokens) == ("HuggingFaceTB/SmolLM2-135M-Instruct", 20, 32, 24)
    assert (config.lora_rank, config.learning_rate, config.seed, config.envs) == (16, 5e-4, 0, [("lab/addition", {"max_operand": 20})])
