"""Prime Intellect's own config files against labsdk.spec and ``lab spec check``: the hosted
template (as written and with every optional section uncommented), prime-rl's native layout
and the older CLI form, from tests/sdk/data/prime/ as published."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from labsdk.spec import SpecError, SpecProblem, loads_spec, parse_spec

from tests.support.prime_configs import DATA, INSTALLED_MODEL, TEMPLATE, installed, uncomment_everything


def keys_warned(warnings):
    return [warning.split("'")[1] for warning in warnings if warning.startswith("'")]


def lab_spec_check(path: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run ``lab spec check`` as a user does, in its own process, with no Lab configured."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("LAB_")}
    return subprocess.run(
        [str(Path(sys.executable).with_name("lab")), "spec", "check", str(path), *extra],
        capture_output=True, text=True, timeout=60, env=environment, check=False,
    )


# --- the hosted template -----------------------------------------------------------------

def test_it_accepts_primes_template_as_written_with_no_warning():
    parsed = loads_spec(installed(TEMPLATE), "toml")

    assert parsed.warnings == []
    assert parsed.spec.loss == "rl"
    assert (parsed.spec.batch_size, parsed.spec.rollouts_per_example, parsed.spec.sampling.max_tokens) == (128, 8, 2048)


def test_it_accepts_primes_template_with_every_section_uncommented_warning_only_for_unused_keys():
    parsed = loads_spec(installed(uncomment_everything(TEMPLATE)), "toml")

    assert keys_warned(parsed.warnings) == [
        "max_inflight_rollouts", "eval.env.0.args.split", "env_files",
    ]
    spec = parsed.spec
    assert spec.init_from == "ckpt_3fA9" and spec.checkpoint_id is None
    assert spec.checkpoints.keep_last == 5 and spec.checkpoints.interval == 100
    assert [env.id for env in spec.env] == ["lab/reverse-text", "lab/addition"]
    assert spec.teacher.client.api_key_var == "OPENAI_API_KEY"
    assert spec.eval.num_examples == -1  # the whole eval split, sized by each environment (Environment.eval_size)
    stored = parsed.to_dict()
    assert "checkpoint_id" not in stored and "keep_cloud" not in stored["checkpoints"]
    assert parse_spec(stored).to_dict() == stored


def test_lab_spec_check_passes_the_uncommented_template_in_its_own_process(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text(installed(uncomment_everything(TEMPLATE)))
    (tmp_path / "secrets.env").write_text("# the template's env_files\nOPENAI_API_KEY='sk-test-1234'\n")

    result = lab_spec_check(path)

    assert result.returncode == 0, result.stderr
    assert "valid locally" in result.stdout
    warned = [line.split("'")[1] for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warned == [  # env_files were read by the CLI: no warning for them
        "max_inflight_rollouts", "eval.env.0.args.split",
    ]
    assert "sk-test-1234" not in result.stdout + result.stderr


def test_lab_spec_check_says_which_secret_the_teacher_lacks_and_which_file_is_missing(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text(installed(uncomment_everything(TEMPLATE)))

    missing_file = lab_spec_check(path)
    (tmp_path / "secrets.env").write_text("OTHER=x\n")
    missing_secret = lab_spec_check(path)
    given = lab_spec_check(path, "-e", "OPENAI_API_KEY=sk-test-1234")

    assert missing_file.returncode == 1
    assert "secrets.env" in missing_file.stderr
    assert missing_secret.returncode == 1
    assert "teacher.client.api_key_var: 'OPENAI_API_KEY' is not among the job's secrets (given: OTHER)" in (
        missing_secret.stderr
    )
    assert given.returncode == 0, given.stderr


def test_lab_spec_check_json_lists_the_template_warnings(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text(installed(TEMPLATE))

    result = lab_spec_check(path, "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["warnings"] == []


def test_it_accepts_the_older_template_translating_keep_cloud_and_warning_for_deprecated_keys():
    text = installed((DATA / "rl-older-template.toml").read_text())
    uncommented = uncomment_everything(text)
    parsed = loads_spec(uncommented, "toml")

    assert parsed.spec.checkpoints.keep_last == -1  # keep_cloud = -1: all; [adapters] keep_last is separate
    assert parsed.spec.max_off_policy_steps == 4
    assert keys_warned(parsed.warnings) == [
        "max_async_level", "eval.eval_base_model", "eval.env.0.args.split", "wandb",
        "env_files", "trajectory_strategy", "buffer",
    ]
    assert parsed.spec.eval.skip_first_step is False  # eval_base_model = true, inverted
    assert any("use [[pre_batch_filters]] with type = \"zero_advantage\"" in w for w in parsed.warnings)
    as_written = loads_spec(text, "toml")
    assert as_written.spec.checkpoints.keep_last == -1 and as_written.warnings == []


# --- prime-rl's native layout --------------------------------------------------------------

def native_installed() -> str:
    text = (DATA / "reverse-text-rl.toml").read_text()
    text = text.replace('name = "PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT"', f'name = "{INSTALLED_MODEL}"')
    return text.replace('{ id = "reverse-text-v1" }', '{ id = "lab/reverse-text" }')


def test_it_translates_prime_rls_native_layout_and_keeps_the_original():
    parsed = loads_spec(native_installed(), "toml")
    spec = parsed.spec

    assert spec.model == INSTALLED_MODEL
    assert (spec.max_steps, spec.batch_size, spec.rollouts_per_example) == (20, 128, 16)
    assert spec.sampling.max_tokens == 128
    assert spec.learning_rate == 3e-6
    assert spec.lora_rank == 0  # no [model.lora]: prime-rl trains every weight
    assert spec.checkpoints.interval == 0  # an empty [ckpt]: only at the end
    assert spec.env[0].id == "lab/reverse-text" and spec.env[0].name == "reverse-text"
    assert spec.env[0].harness == {"id": "null", "runtime": {"type": "subprocess"}}
    assert spec.translated_from.layout == "prime-rl"
    assert spec.translated_from.config == tomllib.loads(native_installed())
    assert parsed.warnings[0].startswith("this is prime-rl's native layout")
    assert keys_warned(parsed.warnings[1:]) == ["orchestrator.renderer", "env.0.harness", "wandb"]
    stored = parsed.to_dict()
    assert parse_spec(stored).to_dict() == stored


def test_it_warns_for_native_keys_it_does_not_translate_instead_of_refusing_them():
    text = native_installed() + '\n[trainer.scheduler]\ntype = "cosine"\n[orchestrator.eval]\ninterval = 5\n'
    text = text.replace("[trainer.optim]\nlr = 3e-6", "[trainer.optim]\nlr = 3e-6\nweight_decay = 0.01\nmax_norm = 1.0")
    parsed = loads_spec(text, "toml")

    assert parsed.spec.eval.interval == 5
    assert {"trainer.optim.weight_decay", "trainer.optim.max_norm", "trainer.scheduler"} <= set(
        keys_warned(parsed.warnings)
    )


def test_it_reads_native_lora_and_gpu_split():
    text = native_installed().replace(
        f'name = "{INSTALLED_MODEL}"', f'name = "{INSTALLED_MODEL}"\nlora = {{ rank = 8, alpha = 32 }}'
    )
    text = 'gpu_type = "H100"\n' + text + "\n[deployment]\nnum_train_gpus = 2\nnum_infer_gpus = 6\n"
    spec = loads_spec(text, "toml").spec

    assert (spec.lora_rank, spec.lora_alpha) == (8, 32)
    assert (spec.resources.gpu_type, spec.resources.gpus) == ("H100", 8)
    assert (spec.resources.num_train_gpus, spec.resources.num_infer_gpus) == (2, 6)
    assert spec.resources.gpu_split() == (2, 6)


# --- the older CLI form ---------------------------------------------------------------------

def test_it_translates_the_older_cli_form_with_a_warning():
    text = (DATA / "rl_config.toml").read_text()
    text = installed(text).replace('"dev-prime/single-turn-math"', '"lab/addition"').replace("4096", "64")
    parsed = loads_spec(text, "toml")

    assert [env.id for env in parsed.spec.env] == ["lab/addition"]
    assert (parsed.spec.rollouts_per_example, parsed.spec.sampling.max_tokens) == (8, 64)
    assert parsed.spec.translated_from.layout == "prime-cli-v0"
    assert parsed.warnings == [
        "this is the older prime CLI form; Lab translated environments to [[env]] blocks, rollouts to "
        "rollouts_per_example, seq_len to sampling.max_tokens: write [[env]] blocks, rollouts_per_example "
        "and sampling.max_tokens instead"
    ]


# --- what maps, and what is refused ----------------------------------------------------------

BASE = {"model": INSTALLED_MODEL, "env": [{"id": "lab/addition"}]}


def refused(**keys):
    with pytest.raises(SpecError) as caught:
        parse_spec({**BASE, **keys})
    return caught.value.errors


def test_checkpoint_id_and_init_from_together_are_refused_naming_both():
    assert refused(checkpoint_id="ckpt_a", init_from="ckpt_b") == [SpecProblem(
        "checkpoint_id", "conflicting_keys",
        "checkpoint_id and init_from are the same setting (the checkpoint to start from); give one",
    )]


def test_keep_cloud_and_keep_last_together_are_refused():
    assert refused(checkpoints={"keep_cloud": 2, "keep_last": 3}) == [SpecProblem(
        "checkpoints.keep_cloud", "conflicting_keys", "keep_cloud and keep_last are the same setting; give one",
    )]
    assert refused(checkpoints={"keep_cloud": 0})[0].code == "out_of_range"


def test_loss_opd_is_a_clear_refusal_and_teacher_follows_loss():
    assert refused(loss="opd")[0].param == "loss"
    assert "not supported" in refused(loss="opd")[0].message
    assert refused(teacher={"model": "t"})[0] == SpecProblem(
        "teacher", "conflicting_keys",
        'a [teacher] is only used with loss = "sft"; remove [teacher] or set loss = "sft"',
    )
    assert refused(loss="sft")[0].code == "required"
    assert parse_spec({**BASE, "loss": "sft", "teacher": {"model": "t"}}).spec.teacher.model == "t"


def test_inflight_bounds_exclude_each_other_and_cover_a_group():
    assert refused(max_inflight_rollouts=8, oversampling_factor=1.5)[0].code == "conflicting_keys"
    assert refused(max_inflight_rollouts=2)[0] == SpecProblem(
        "max_inflight_rollouts", "out_of_range",
        "max_inflight_rollouts (2) must be at least rollouts_per_example (4): a group is sampled at once",
    )


def test_temperature_schedules_are_checked():
    schedule = {"type": "cosine", "start_temperature": 1.0, "end_temperature": 0.5, "total_steps": 21}
    assert refused(sampling={"temp_scheduler": schedule})[0].param == "sampling.temp_scheduler.total_steps"
    negative = {**schedule, "total_steps": 10, "end_temperature": -0.1}
    assert refused(sampling={"temp_scheduler": negative})[0].param == "sampling.temp_scheduler.end_temperature"
    assert refused(sampling={"temp_scheduler": {**schedule, "type": "step"}})[0].code == "invalid_value"
    assert parse_spec({**BASE, "sampling": {"temp_scheduler": {**schedule, "total_steps": 10}}}).warnings == []


def test_reasoning_controls_exclude_each_other():
    assert refused(sampling={"enable_thinking": True, "reasoning_effort": "low"})[0] == SpecProblem(
        "sampling.reasoning_effort", "conflicting_keys",
        "enable_thinking and reasoning_effort cannot both be set; keep one",
    )


def test_both_env_forms_are_accepted():
    legacy = {"id": "lab/addition", "args": {"max_operand": 5}, "version": "1.0", "max_retries": 2}
    v1 = {
        "name": "rev", "taskset": {"id": "lab/reverse-text"},
        "harness": {"id": "null", "runtime": {"type": "subprocess"}}, "ratio": 0.5, "group_size": 4,
        "max_turns": 1, "max_input_tokens": 256, "max_output_tokens": 64, "timeout": 30.0, "retries": 1,
    }
    parsed = parse_spec({**BASE, "env": [legacy, v1]})

    assert [env.id for env in parsed.spec.env] == ["lab/addition@1.0", "lab/reverse-text"]
    assert not any("ratio" in warning for warning in parsed.warnings)  # ratio mixes the environments (engine.orchestrator.environment_index)
    assert refused(env=[{"name": "x"}])[0].param == "env.0.id"
    assert refused(env=[{"id": "lab/addition@2", "version": "1"}])[0].code == "conflicting_keys"


def test_an_env_blocks_group_size_is_used_and_must_fill_each_batch_with_whole_groups():
    mixed = parse_spec({**BASE, "batch_size": 8, "env": [{"id": "lab/addition", "group_size": 2}, {"id": "lab/reverse-text"}]})
    assert [env.group_size for env in mixed.spec.env] == [2, None]  # the second takes rollouts_per_example (4)
    assert not any("group_size" in warning for warning in mixed.warnings)

    not_a_divisor = refused(batch_size=8, env=[{"id": "lab/addition"}, {"id": "lab/reverse-text", "group_size": 3}])
    assert [(p.param, p.code) for p in not_a_divisor] == [("env.1.group_size", "not_divisible")]
    assert "batch_size (8) must be a multiple of this block's group_size (3)" in not_a_divisor[0].message
    # 2 and 3 both divide 6, but a step of 2 + 3 could not be filled with whole groups
    unfillable = refused(batch_size=6, env=[{"id": "lab/addition", "group_size": 2}, {"id": "lab/reverse-text", "group_size": 3}])
    assert [(p.param, p.code) for p in unfillable] == [("env.1.group_size", "not_divisible")]
    assert "multiple of the smallest (2)" in unfillable[0].message
    # every block sets its own: rollouts_per_example no longer has to divide batch_size
    parse_spec({**BASE, "batch_size": 6, "rollouts_per_example": 4, "env": [{"id": "lab/addition", "group_size": 2}]})
    assert [p.param for p in refused(batch_size=6, env=[{"id": "lab/addition", "group_size": 2}, {"id": "lab/addition"}])] == ["batch_size"]
    inflight = refused(batch_size=16, max_inflight_rollouts=4, env=[{"id": "lab/addition", "group_size": 8}])
    assert [(p.param, p.code) for p in inflight] == [("max_inflight_rollouts", "out_of_range")]
    assert refused(env=[{"id": "lab/addition", "group_size": 0}])[0].param == "env.0.group_size"


def test_an_env_blocks_name_must_be_one_metric_name_segment_and_unique():
    assert not any("env.0.name" in warning for warning in parse_spec({**BASE, "env": [{"id": "lab/addition", "name": "small"}]}).warnings)
    for bad in ("a/b", "", "-x", "x y", "é", "x" * 65):
        assert refused(env=[{"id": "lab/addition", "name": bad}])[0].param == "env.0.name", bad
    twice = refused(env=[{"id": "lab/addition", "name": "a"}, {"id": "lab/reverse-text", "name": "a"}])
    assert [(p.param, p.code) for p in twice] == [("env.1.name", "duplicate_name")]
    evals = refused(eval={"env": [{"id": "lab/addition", "name": "a"}, {"id": "lab/addition", "name": "a"}]})
    assert [(p.param, p.code) for p in evals] == [("eval.env.1.name", "duplicate_name")]
    # the same name in [[env]] and [[eval.env]] is fine: they report under reward/ and eval/
    parse_spec({**BASE, "env": [{"id": "lab/addition", "name": "a"}], "eval": {"env": [{"id": "lab/addition", "name": "a"}]}})


def test_retries_and_primes_legacy_max_retries_are_one_setting():
    envs = parse_spec({**BASE, "env": [
        {"id": "lab/addition", "retries": 2}, {"id": "lab/addition", "max_retries": 3},
        {"id": "lab/addition", "retries": 1, "max_retries": 1}, {"id": "lab/addition"},
    ]})
    assert [env.rollout_retries for env in envs.spec.env] == [2, 3, 1, 0]
    assert not any("retries" in warning for warning in envs.warnings)
    problem = refused(env=[{"id": "lab/addition", "retries": 1, "max_retries": 2}])[0]
    assert (problem.param, problem.code) == ("env.0.retries", "conflicting_keys")
    assert refused(env=[{"id": "lab/addition", "retries": 101}])[0].param == "env.0.retries"


def test_timeout_is_positive_seconds_up_to_a_day_and_warned_on_a_built_in_environment():
    envs = parse_spec({**BASE, "env": [{"id": "acme/guess-env", "timeout": 30}, {"id": "acme/spell", "timeout": 0.5},
                                       {"id": "acme/spell"}]})
    assert [env.timeout for env in envs.spec.env] == [30.0, 0.5, None]
    assert not any("timeout" in warning for warning in envs.warnings)
    for bad, code in ((0, "out_of_range"), (-1, "out_of_range"), (86_401, "out_of_range"), ("30", "invalid_type"),
                      (True, "invalid_type"), (float("nan"), "invalid_value")):
        assert [(p.param, p.code) for p in refused(env=[{"id": "acme/spell", "timeout": bad}])] == [("env.0.timeout", code)], bad
    assert refused(eval={"env": [{"id": "acme/spell", "timeout": 0}]})[0].param == "eval.env.0.timeout"
    built_in = parse_spec({**BASE, "env": [{"id": "lab/addition", "timeout": 5}]})
    assert built_in.warnings == [
        "'env.0.timeout': lab/addition is one of Lab's built-in environments, which score in the engine; the timeout "
        "bounds a verifiers environment's episode or scoring and does not apply to it; it is stored and ignored"
    ]


def test_episode_limits_are_warned_on_a_built_in_single_turn_environment_only():
    limits = {"max_turns": 3, "max_input_tokens": 100, "max_output_tokens": 50}
    assert parse_spec({**BASE, "env": [{"id": "acme/guess-env", **limits}]}).warnings == []
    built_in = parse_spec({**BASE, "env": [{"id": "lab/addition", "max_turns": 3}],
                           "eval": {"env": [{"id": "lab/reverse-text", "max_output_tokens": 50}]}})
    assert built_in.warnings == [
        ("'env.0.max_turns': lab/addition is a single-turn environment (one completion per example), so max_turns, "
         "which bounds the turns of a multi-turn episode, has no effect on it; it is stored and ignored"),
        ("'eval.env.0.max_output_tokens': lab/reverse-text is a single-turn environment (one completion per example), "
         "so max_output_tokens, which bounds the tokens each agent samples in a multi-turn episode, has no effect "
         "on it; it is stored and ignored"),
    ]


def test_a_misspelt_key_gets_the_closest_allowed_key():
    problem = refused(max_step=5)[0]
    assert problem.message.startswith("unknown key 'max_step' (did you mean 'max_steps'?); allowed keys: name,")


def test_unused_prime_tables_are_stored_with_a_warning_and_a_tailscale_key_is_not_kept():
    parsed = parse_spec({
        **BASE, "cluster_name": "c1", "run_config": {"a": 1}, "infrastructure": {"compute_size": "m"},
        "tailscale": {"enabled": True, "auth_key": "tskey-auth-secret"},
    })

    assert keys_warned(parsed.warnings) == ["cluster_name", "run_config", "infrastructure", "tailscale"]
    stored = parsed.to_dict()
    assert stored["tailscale"] == {"enabled": True, "auth_key": "[redacted]"}
    assert "tskey-auth-secret" not in json.dumps(stored)
    assert stored["infrastructure"] == {"compute_size": "m"}


def test_filters_keep_their_own_settings_and_refuse_bad_ones():
    parsed = parse_spec({**BASE, "post_batch_filters": [{"type": "repetition", "enforce": False, "ngram": 4}]})
    assert parsed.to_dict()["post_batch_filters"] == [{"type": "repetition", "enforce": False, "ngram": 4}]
    assert refused(pre_batch_filters=[{"type": "nonsense"}])[0].param == "pre_batch_filters.0.type"
    assert refused(pre_batch_filters=[{"type": "gibberish", "threshold": float("nan")}])[0].param == (
        "pre_batch_filters.0.threshold"
    )


def test_the_temperature_schedule_runs_from_start_to_end_and_stays():
    def at(kind, step, total_steps=None):
        schedule = {"type": kind, "start_temperature": 1.0, "end_temperature": 0.5}
        if total_steps:
            schedule["total_steps"] = total_steps
        spec = parse_spec({**BASE, "max_steps": 5, "sampling": {"temp_scheduler": schedule}}).spec
        return spec.sampling.temperature_at(step, spec.max_steps)

    assert [at("linear", step) for step in range(1, 6)] == [1.0, 0.875, 0.75, 0.625, 0.5]
    assert [round(at("cosine", step), 6) for step in (1, 3, 5)] == [1.0, 0.75, 0.5]
    assert round(at("cosine", 2), 6) == round(0.5 + 0.5 * (1 + 0.7071067811865476) / 2, 6)
    assert [at("linear", step, total_steps=3) for step in (1, 2, 3, 4, 5)] == [1.0, 0.75, 0.5, 0.5, 0.5]
    assert parse_spec(BASE).spec.sampling.temperature_at(3, 20) == 1.0


def run_engine(tmp_path: Path, text: str) -> Path:
    """Run the engine offline on a spec file's text, as a job would; return its work dir."""
    (tmp_path / "rl.toml").write_text(text)
    root = Path(__file__).parents[2]
    environment = {**os.environ, "LAB_DATA_DIR": str(tmp_path / "data"),
                   "PYTHONPATH": os.pathsep.join([str(root), str(root / "sdk")])}
    result = subprocess.run(
        [sys.executable, "-m", "engine", "run", "--spec", str(tmp_path / "rl.toml"), "--job-id", "job_prime",
         "--attempt", "1", "--workdir", str(tmp_path / "work"), "--offline"],
        capture_output=True, text=True, timeout=300, env=environment, cwd=root, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return tmp_path / "work"


@pytest.mark.e2e
def test_prime_rls_reverse_text_example_runs_on_the_tiny_model(tmp_path):
    """The example as published, its ids pointed at installed ones and two steps of 16 rollouts
    (the full 20 steps of 128 run the same way, in about two minutes on 2 cores)."""
    text = native_installed().replace("max_steps = 20", "max_steps = 2").replace("batch_size = 128", "batch_size = 16")

    work = run_engine(tmp_path, text)

    steps = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [point["step"] for point in steps] == [1, 2]
    assert steps[-1]["values"]["optim/lr"] == 3e-6  # [trainer.optim] lr
    assert sorted(path.name for path in (work / "checkpoints").iterdir()) == [
        "step-000002", "step-000002.tar",  # an empty [ckpt]: only at the end
    ]


@pytest.mark.e2e
def test_the_engine_follows_the_temperature_schedule(tmp_path):
    text = (
        f'model = "{INSTALLED_MODEL}"\nmax_steps = 3\nbatch_size = 4\nrollouts_per_example = 2\n'
        "[sampling]\nmax_tokens = 4\n"
        'temp_scheduler = { type = "linear", start_temperature = 1.0, end_temperature = 0.5, total_steps = 2 }\n'
        '[[env]]\nid = "lab/addition"\n[checkpoints]\ninterval = 0\n'
    )
    assert parse_spec(tomllib.loads(text)).warnings == []  # honoured, so no warning

    work = run_engine(tmp_path, text)

    steps = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [point["values"]["sampling/temperature"] for point in steps] == [1.0, 0.5, 0.5]


def test_a_problem_in_a_translated_config_names_the_key_as_written():
    with pytest.raises(SpecError) as native:
        parse_spec({"model": {"name": INSTALLED_MODEL}, "orchestrator": {
            "batch_size": -1, "train": {"env": [{"env": {"taskset": {"id": "reverse-text-v1"}}}]}}})
    with pytest.raises(SpecError) as older:
        parse_spec({"model": INSTALLED_MODEL, "environments": ["lab/addition", "not an id"], "rollouts": 0})

    assert [(p.param, p.message.rsplit(" (given as ", 1)[-1]) for p in native.value.errors] == [
        ("batch_size", "'orchestrator.batch_size')"), ("env.0.taskset.id", "'orchestrator.train.env.0')"),
    ]
    assert [(p.param, p.message.rsplit(" (given as ", 1)[-1]) for p in older.value.errors] == [
        ("rollouts_per_example", "'rollouts')"), ("env.1.id", "'environments.1')"),
    ]
