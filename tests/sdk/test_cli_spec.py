"""``lab spec init``, ``lab spec schema`` and the spec help: a spec can be written from scratch
without opening any file outside the repository. Run as a user would, through the installed
``lab`` script in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from labsdk.spec import SpecError, job_spec_json_schema, load_spec_file, parse_spec
from labsdk.spec_template import UNCOMMENT_WITH, spec_fields, spec_template

LAB = Path(sys.executable).with_name("lab")


def lab(*argv: str, cwd: Path, api_key: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_API_KEY", "LAB_BASE_URL")}
    if api_key:
        env["LAB_API_KEY"] = api_key
    return subprocess.run([str(LAB), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_it_writes_a_template_that_spec_check_passes_as_written(tmp_path):
    init = lab("spec", "init", "job.toml", "--model", "lab/tiny-random-llama", "--env", "lab/reverse-text", cwd=tmp_path)
    check = lab("spec", "check", "job.toml", cwd=tmp_path)

    assert init.returncode == 0, init.stderr
    assert init.stdout == ""
    assert "wrote job.toml" in init.stderr
    assert check.returncode == 0, check.stderr
    assert check.stdout == (
        "job.toml: valid locally; its model and environments were not checked (no LAB_API_KEY): "
        "set LAB_API_KEY to check them, and the pool, through Lab\n"
    )
    assert check.stderr == ""
    spec = load_spec_file(tmp_path / "job.toml").spec
    assert (spec.model, [env.id for env in spec.env], spec.name) == (
        "lab/tiny-random-llama", ["lab/reverse-text"], "reverse-text-run",
    )


def test_it_prints_the_default_template_without_a_file_and_comments_every_key(tmp_path):
    result = lab("spec", "init", cwd=tmp_path)

    assert result.returncode == 0 and list(tmp_path.iterdir()) == []
    assert result.stdout == spec_template()
    lines = result.stdout.splitlines()
    assert 'model = "HuggingFaceTB/SmolLM2-135M-Instruct"  # Model catalogue id (GET /api/v1/models).' in lines
    assert 'id = "lab/addition"  # Environment id: built-in "lab/<name>" or uploaded ' \
        '"<organization slug>/<name>[@<version>]".' in lines
    assert '# init_from = "ckpt_0123456789abcdefghij"  # Start from this ready checkpoint of the same project.' in lines
    assert "`lab models`" in result.stdout and "`lab envs`" in result.stdout
    settings = [line for line in lines if line and not line.startswith(("#", "["))]
    assert all("  # " in line for line in settings)


def _placeholders(text: str) -> list[tuple[int, str, str]]:
    """Return each commented-out setting of a template: (line index, dotted key, section)."""
    found, section = [], ""
    for index, line in enumerate(text.splitlines()):
        header = re.match(r"^\[\[?([a-z_]+)\]\]?", line)
        if header:
            section = header.group(1)
        setting = re.match(r"^# ([a-z_]+) = ", line)
        if setting:
            found.append((index, f"{section}.{setting.group(1)}".lstrip("."), section))
    return found


@pytest.mark.parametrize("env", ["lab/addition", "acme/vowel-count@0.1.0"])
def test_every_commented_setting_of_the_template_is_a_valid_example_once_uncommented(env):
    text = spec_template(env=env)
    placeholders = _placeholders(text)

    assert {"teacher", "val", "adapters", "pre_batch_filters", "sampling.temp_scheduler", "eval.env",
            "eval.rollouts_per_example", "max_inflight_rollouts", "resources.num_train_gpus"} <= {
        key for _, key, _ in placeholders}
    for index, key, section in placeholders:
        lines = text.splitlines()
        lines[index] = lines[index].removeprefix("# ")
        data = tomllib.loads("\n".join(lines))
        table = data[section] if section else data
        needs = lines[index].partition(UNCOMMENT_WITH)[2].removesuffix(".")
        if needs:  # the settings its comment names, in its own table
            table.update(tomllib.loads(needs.replace(", ", "\n")))
        name = key.rpartition(".")[2]

        assert name in table, key
        try:
            parse_spec(data)
        except SpecError as exc:
            pytest.fail(f"{key} uncommented: {[problem.to_dict() for problem in exc.errors]}")


def test_the_template_leaves_out_other_names_and_keys_lab_only_stores():
    keys = {key for _, key, _ in _placeholders(spec_template())}

    assert not keys & {"checkpoint_id", "max_async_level", "checkpoints.keep_cloud", "eval.eval_base_model",
                       "wandb", "cluster_name", "env_file", "translated_from"}
    assert "env_files" in keys


def test_it_refuses_to_overwrite_a_file_without_force(tmp_path):
    (tmp_path / "job.toml").write_text("mine\n")

    refused = lab("spec", "init", "job.toml", cwd=tmp_path)

    assert refused.returncode == 2
    assert "job.toml exists; pass --force to overwrite it" in refused.stderr
    assert (tmp_path / "job.toml").read_text() == "mine\n"
    assert lab("spec", "init", "job.toml", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "job.toml").read_text() == spec_template()


def test_it_prints_the_json_schema_lab_serves(tmp_path):
    result = lab("spec", "schema", cwd=tmp_path)

    assert result.returncode == 0
    assert json.loads(result.stdout) == job_spec_json_schema()


def test_it_prints_every_key_with_type_default_and_meaning(tmp_path):
    table = lab("spec", "schema", "--fields", cwd=tmp_path)
    as_json = lab("spec", "schema", "--fields", "--json", cwd=tmp_path)

    assert table.returncode == 0 and as_json.returncode == 0
    rows = {row["key"]: row for row in json.loads(as_json.stdout)}
    assert rows["max_steps"] == {"key": "max_steps", "type": "integer", "default": 20, "required": False,
                                 "meaning": "Training steps."}
    assert rows["model"]["required"] is True
    assert rows["sampling.temperature"]["type"] == "number"
    assert rows["env"]["required"] is True and rows["env"]["type"] == "list of tables"
    assert rows["env[].id"]["type"] == "string"
    assert rows["priority"]["type"] == '"low" | "normal" | "high"'
    assert set(rows) == {field.key for field in spec_fields()}
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["KEY", "TYPE", "DEFAULT", "MEANING"]
    assert any(line.split()[:3] == ["max_steps", "integer", "20"] for line in lines)
    assert any(line.split()[:3] == ["model", "string", "required"] for line in lines)


def test_the_spec_help_names_init_schema_models_and_envs(tmp_path):
    result = lab("spec", "--help", cwd=tmp_path)

    assert result.returncode == 0
    for words in ("init", "schema", "check", "`lab models`", "`lab envs`", "lab spec schema --fields"):
        assert words in result.stdout


def test_a_spec_as_toml_reads_back_to_the_same_data():
    import tomllib

    from labsdk.spec_template import spec_to_toml

    spec = {
        "name": "run \"one\"", "model": "lab/tiny-random-llama", "learning_rate": 1e-05, "init_from": None,
        "sampling": {"max_tokens": 8, "temperature": 1.0},
        "env": [{"id": "lab/addition", "args": {"max_operand": 9, "nested": {"a": [1, 2]}}}, {"id": "lab/reverse-text"}],
        "eval": {"interval": 0, "sampling": {"temperature": 0.5}},
        "metadata": {"team": "r&d", "a.b": "x"},
    }

    text = spec_to_toml(spec, comment="from ckpt_1")

    assert text.startswith("# from ckpt_1\nname = ")
    assert tomllib.loads(text) == {k: v for k, v in spec.items() if v is not None}
