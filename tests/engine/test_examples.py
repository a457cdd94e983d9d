"""The example job specs in examples/ are valid against the spec model and the catalogues."""

import pytest

from engine.commands.attempt import load_config

from .conftest import REPO_ROOT

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*-tiny.toml")) + sorted((REPO_ROOT / "examples").glob("*-smollm2.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_it_accepts_the_example_specs(path):
    config, warnings = load_config(path)
    assert warnings == []
    assert config.spec.batch_size % config.spec.rollouts_per_example == 0


def test_it_has_the_main_job_settings():
    spec = load_config(REPO_ROOT / "examples" / "addition-smollm2.toml")[0].spec
    assert (spec.model, spec.max_steps, spec.batch_size, spec.sampling.max_tokens) == (
        "HuggingFaceTB/SmolLM2-135M-Instruct", 20, 32, 24
    )
    assert (spec.lora_rank, spec.learning_rate, spec.seed) == (16, 5e-4, 0)
    assert [(env.id, env.args) for env in spec.env] == [("lab/addition", {"max_operand": 20})]
