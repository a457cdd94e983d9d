"""Tests for labsdk.spec: the job spec model, its files and its catalogue checks."""

import json
from dataclasses import dataclass, field

import pytest
from labsdk.spec import (
    JobSpec,
    SpecError,
    SpecProblem,
    catalog_problems,
    job_spec_json_schema,
    load_spec_file,
    loads_spec,
    parse_spec,
)

from tests.support.spec_examples import DESIGN_EXAMPLE_TOML, MINIMAL, PRIME_ONLY_TOML


def spec_with(**changes):
    """Return MINIMAL with top-level keys replaced (None deletes the key)."""
    data = json.loads(json.dumps(MINIMAL))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def problems_of(data):
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return [(problem.param, problem.code) for problem in caught.value.errors]


# --- good specs ----------------------------------------------------------------------------

def test_it_fills_documented_defaults_into_a_minimal_spec():
    parsed = parse_spec(MINIMAL)

    assert parsed.warnings == []
    assert parsed.to_dict() == {
        "name": None,
        "model": "lab/tiny-random-llama",
        "loss": "rl",
        "max_steps": 20,
        "batch_size": 32,
        "rollouts_per_example": 4,
        "learning_rate": 0.0001,
        "lora_alpha": 16,
        "lora_rank": 16,
        "seed": 0,
        "max_restarts": 2,
        "max_off_policy_steps": 1,
        "priority": "normal",
        "max_runtime_minutes": 600,
        "init_from": None,
        "sampling": {"max_tokens": 128, "temperature": 1.0},
        "env": [{"id": "lab/addition", "args": {}}],
        "eval": {"interval": 0, "num_examples": 32},
        "checkpoints": {"interval": 10, "keep_last": 3},
        "resources": {"gpu_type": "cpu", "gpus": 0},
        "metadata": {},
    }


GOOD_SPECS = {
    "full fine-tune": spec_with(lora_rank=0),
    "integer learning rate": spec_with(learning_rate=1),
    "group size equals batch": spec_with(batch_size=8, rollouts_per_example=8),
    "group of one": spec_with(batch_size=7, rollouts_per_example=1),
    "gpu type defaults to one gpu": spec_with(resources={"gpu_type": "H100"}),
    "eight gpus": spec_with(resources={"gpu_type": "H200", "gpus": 8}),
    "versioned uploaded env": spec_with(env=[{"id": "acme/maze@1.2.0", "args": {"size": 5}}]),
    "two envs": spec_with(env=[{"id": "lab/addition"}, {"id": "lab/reverse-text"}]),
    "sixteen metadata pairs": spec_with(metadata={f"k{i}": "v" * 512 for i in range(16)}),
    "zero temperature": spec_with(sampling={"temperature": 0, "max_tokens": 1}),
    "nested args at the depth limit": spec_with(
        env=[{"id": "lab/addition", "args": {"a": [[[[[[[1]]]]]]]}}]
    ),
    "init from a checkpoint": spec_with(init_from="ckpt_abc123", priority="high"),
    "unicode name": spec_with(name="ε-greedy 加法"),
}


@pytest.mark.parametrize("data", GOOD_SPECS.values(), ids=GOOD_SPECS.keys())
def test_it_accepts_good_specs(data):
    parsed = parse_spec(data)

    assert isinstance(parsed.spec, JobSpec)
    assert parsed.warnings == []
    assert parse_spec(parsed.to_dict()).to_dict() == parsed.to_dict()


def test_it_resolves_gpus_from_the_gpu_type():
    assert parse_spec(spec_with(resources={"gpu_type": "H100"})).spec.resources.gpus == 1
    assert parse_spec(MINIMAL).spec.resources.gpus == 0


@pytest.mark.parametrize(("resources", "gpus", "split"), [
    ({"gpu_type": "H100", "gpus": 8}, 8, (4, 4)),
    ({"gpu_type": "H100", "gpus": 3}, 3, (1, 2)),  # inference the larger half
    ({"gpu_type": "H100", "gpus": 8, "num_train_gpus": 6}, 8, (6, 2)),
    ({"gpu_type": "H100", "gpus": 8, "num_infer_gpus": 1}, 8, (7, 1)),
    ({"gpu_type": "H100", "num_train_gpus": 2, "num_infer_gpus": 6}, 8, (2, 6)),  # gpus: their sum
    ({"gpu_type": "H100"}, 1, (1, 1)),  # one GPU: the whole engine shares it
    ({"gpu_type": "cpu"}, 0, (0, 0)),
])
def test_it_splits_the_gpus_between_the_trainer_and_inference(resources, gpus, split):
    parsed = parse_spec(spec_with(resources=resources))
    assert (parsed.spec.resources.gpus, parsed.spec.resources.gpu_split()) == (gpus, split)
    assert parsed.warnings == []


def test_it_moves_top_level_gpu_split_keys_into_resources_with_a_warning():
    parsed = parse_spec(spec_with(num_train_gpus=2, num_infer_gpus=2, resources={"gpu_type": "H100"}))
    assert parsed.spec.model_dump()["resources"] == {"gpu_type": "H100", "gpus": 4, "num_train_gpus": 2, "num_infer_gpus": 2}
    assert parsed.warnings == [
        "'num_train_gpus' belongs in [resources]: read as 'resources.num_train_gpus'",
        "'num_infer_gpus' belongs in [resources]: read as 'resources.num_infer_gpus'",
    ]
    # A problem of a moved key names it as written.
    with pytest.raises(SpecError) as refused:
        parse_spec(spec_with(num_train_gpus=9, resources={"gpu_type": "H100", "gpus": 4}))
    assert refused.value.param == "resources.num_train_gpus" and "(given as 'num_train_gpus')" in str(refused.value)


def test_it_reads_the_design_example():
    parsed = loads_spec(DESIGN_EXAMPLE_TOML, "toml")

    assert parsed.spec.env[0].args == {"max_operand": 20}
    assert parsed.spec.metadata == {"team": "research"}
    assert parsed.spec.learning_rate == 5e-4
    assert parsed.warnings == []


def test_it_accepts_a_prime_only_toml_with_warnings_and_stores_their_keys():
    parsed = loads_spec(PRIME_ONLY_TOML, "toml")

    assert [warning.split("'")[1] for warning in parsed.warnings] == [
        "oversampling_factor", "max_async_level", "wandb", "env_files", "trajectory_strategy",
    ]
    assert parsed.warnings[1] == (
        "'max_async_level' is deprecated: prime-rl renamed it max_off_policy_steps; "
        "Lab uses it as max_off_policy_steps = 2"
    )
    stored = parsed.to_dict()
    assert stored["oversampling_factor"] == 1.5
    assert stored["max_async_level"] == 2
    assert stored["max_off_policy_steps"] == 2
    assert stored["trajectory_strategy"] == "interleaved"
    assert stored["env_files"] == ["secrets.env"]
    assert stored["wandb"] == {"project": "lab-runs", "name": "addition"}
    assert stored["sampling"] == {"max_tokens": 512, "temperature": 1.0, "enable_thinking": False}
    assert "env_file" not in stored
    assert parse_spec(stored).to_dict() == stored


def test_it_accepts_primes_documented_env_file_spelling():
    parsed = parse_spec(spec_with(env_file=["secrets.env"]))

    assert parsed.to_dict()["env_file"] == ["secrets.env"]
    assert len(parsed.warnings) == 1


# --- bad specs: (data, [(param, code), ...]) in the order reported -------------------------

BAD_SPECS = {
    "missing model": (spec_with(model=None), [("model", "required")]),
    "missing env": (spec_with(env=None), [("env", "required")]),
    "empty env list": (spec_with(env=[]), [("env", "too_short")]),
    "env without id": (spec_with(env=[{"args": {}}]), [("env.0.id", "required")]),
    "env id without owner": (spec_with(env=[{"id": "addition"}]), [("env.0.id", "invalid_value")]),
    "second env id wrong type": (
        spec_with(env=[{"id": "lab/addition"}, {"id": 5}]), [("env.1.id", "invalid_type")]
    ),
    "env list too long": (
        spec_with(env=[{"id": "lab/addition"}] * 17), [("env", "too_long")]
    ),
    "env args not a table": (
        spec_with(env=[{"id": "lab/addition", "args": [1]}]), [("env.0.args", "invalid_type")]
    ),
    "env args too deep": (
        spec_with(env=[{"id": "lab/addition", "args": {"a": [[[[[[[[1]]]]]]]]}}]),
        [("env.0.args.a.0.0.0.0.0.0.0.0", "too_deep")],
    ),
    "env args infinity": (
        spec_with(env=[{"id": "lab/addition", "args": {"a": {"b": [1, float("inf")]}}}]),
        [("env.0.args.a.b.1", "invalid_value")],
    ),
    "env args huge string": (
        spec_with(env=[{"id": "lab/addition", "args": {"text": "x" * 1_000_000}}]),
        [("env.0.args.text", "too_long")],
    ),
    "env args too many values": (
        spec_with(env=[{"id": "lab/addition", "args": {"a": list(range(1000))}}]),
        [("env.0.args", "too_long")],
    ),
    "env unknown key": (
        spec_with(env=[{"id": "lab/addition", "files": []}]), [("env.0.files", "unknown_key")]
    ),
    "model wrong type": (spec_with(model=7), [("model", "invalid_type")]),
    "model empty": (spec_with(model=""), [("model", "too_short")]),
    "model too long": (spec_with(model="m" * 257), [("model", "too_long")]),
    "name 1 MB": (spec_with(name="n" * 1_000_000), [("name", "too_long")]),
    "max_steps zero": (spec_with(max_steps=0), [("max_steps", "out_of_range")]),
    "max_steps negative": (spec_with(max_steps=-5), [("max_steps", "out_of_range")]),
    "max_steps huge": (spec_with(max_steps=10**100), [("max_steps", "out_of_range")]),
    "max_steps float": (spec_with(max_steps=2.5), [("max_steps", "invalid_type")]),
    "max_steps string": (spec_with(max_steps="20"), [("max_steps", "invalid_type")]),
    "max_steps boolean": (spec_with(max_steps=True), [("max_steps", "invalid_type")]),
    "batch_size zero": (spec_with(batch_size=0), [("batch_size", "out_of_range")]),
    "batch not a multiple of the group": (
        spec_with(batch_size=30, rollouts_per_example=4), [("batch_size", "not_divisible")]
    ),
    "default group does not divide batch": (
        spec_with(batch_size=6), [("batch_size", "not_divisible")]
    ),
    "rollouts_per_example zero": (
        spec_with(rollouts_per_example=0), [("rollouts_per_example", "out_of_range")]
    ),
    "learning_rate zero": (spec_with(learning_rate=0.0), [("learning_rate", "out_of_range")]),
    "learning_rate NaN": (
        spec_with(learning_rate=float("nan")), [("learning_rate", "invalid_value")]
    ),
    "learning_rate infinity": (
        spec_with(learning_rate=float("inf")), [("learning_rate", "invalid_value")]
    ),
    "learning_rate boolean": (spec_with(learning_rate=True), [("learning_rate", "invalid_type")]),
    "env args not JSON": (
        spec_with(env=[{"id": "lab/addition", "args": {"x": 1 + 2j}}]), [("env.0.args.x", "invalid_type")]
    ),
    "learning_rate too large for a float": (
        spec_with(learning_rate=10**400), [("learning_rate", "out_of_range")]
    ),
    "lora_rank negative": (spec_with(lora_rank=-1), [("lora_rank", "out_of_range")]),
    "lora_alpha zero": (spec_with(lora_alpha=0), [("lora_alpha", "out_of_range")]),
    "seed beyond 32 bits": (spec_with(seed=2**32), [("seed", "out_of_range")]),
    "max_restarts too many": (spec_with(max_restarts=21), [("max_restarts", "out_of_range")]),
    "max_off_policy_steps negative": (
        spec_with(max_off_policy_steps=-1), [("max_off_policy_steps", "out_of_range")]
    ),
    "priority unknown": (spec_with(priority="urgent"), [("priority", "invalid_value")]),
    "runtime beyond a week": (
        spec_with(max_runtime_minutes=10_081), [("max_runtime_minutes", "out_of_range")]
    ),
    "init_from not a checkpoint id": (
        spec_with(init_from="job_abc"), [("init_from", "invalid_value")]
    ),
    "sampling temperature NaN": (
        spec_with(sampling={"temperature": float("nan")}),
        [("sampling.temperature", "invalid_value")],
    ),
    "sampling temperature above 2": (
        spec_with(sampling={"temperature": 2.5}), [("sampling.temperature", "out_of_range")]
    ),
    "sampling max_tokens zero": (
        spec_with(sampling={"max_tokens": 0}), [("sampling.max_tokens", "out_of_range")]
    ),
    "sampling unknown key": (
        spec_with(sampling={"top_k": 5}), [("sampling.top_k", "unknown_key")]
    ),
    "sampling not a table": (spec_with(sampling=5), [("sampling", "invalid_type")]),
    "eval interval negative": (
        spec_with(eval={"interval": -1}), [("eval.interval", "out_of_range")]
    ),
    "checkpoints keep_last zero": (
        spec_with(checkpoints={"keep_last": 0}), [("checkpoints.keep_last", "out_of_range")]
    ),
    "gpus on cpu": (
        spec_with(resources={"gpu_type": "cpu", "gpus": 2}), [("resources.gpus", "invalid_value")]
    ),
    "zero gpus of a gpu type": (
        spec_with(resources={"gpu_type": "H100", "gpus": 0}),
        [("resources.gpus", "invalid_value")],
    ),
    "gpus beyond 64": (
        spec_with(resources={"gpu_type": "H100", "gpus": 65}),
        [("resources.gpus", "out_of_range")],
    ),
    "a gpu split of a cpu job": (
        spec_with(resources={"num_train_gpus": 1}), [("resources.num_train_gpus", "invalid_value")]
    ),
    "a gpu split of one gpu": (
        spec_with(resources={"gpu_type": "H100", "gpus": 1, "num_infer_gpus": 1}),
        [("resources.num_infer_gpus", "invalid_value")],
    ),
    "a gpu split that does not add up": (
        spec_with(resources={"gpu_type": "H100", "gpus": 4, "num_train_gpus": 2, "num_infer_gpus": 3}),
        [("resources.num_train_gpus", "invalid_value")],
    ),
    "a gpu split leaving inference nothing": (
        spec_with(resources={"gpu_type": "H100", "gpus": 4, "num_train_gpus": 4}),
        [("resources.num_train_gpus", "invalid_value")],
    ),
    "a gpu split of zero": (
        spec_with(resources={"gpu_type": "H100", "gpus": 4, "num_infer_gpus": 0}),
        [("resources.num_infer_gpus", "out_of_range")],
    ),
    "a gpu split given twice": (
        spec_with(num_train_gpus=2, resources={"gpu_type": "H100", "gpus": 4, "num_train_gpus": 2}),
        [("num_train_gpus", "unknown_key"), ("num_train_gpus", "conflicting_keys")],
    ),
    "gpu_type with spaces": (
        spec_with(resources={"gpu_type": "H 100"}), [("resources.gpu_type", "invalid_value")]
    ),
    "metadata 17 pairs": (
        spec_with(metadata={f"k{i}": "v" for i in range(17)}), [("metadata", "too_long")]
    ),
    "metadata key too long": (
        spec_with(metadata={"k" * 65: "v"}), [("metadata." + "k" * 65, "too_long")]
    ),
    "metadata value too long": (
        spec_with(metadata={"team": "v" * 513}), [("metadata.team", "too_long")]
    ),
    "metadata value not a string": (
        spec_with(metadata={"team": 5}), [("metadata.team", "invalid_type")]
    ),
    "unknown top-level key": (spec_with(epochs=3), [("epochs", "unknown_key")]),
    "prime key with an unserialisable value": (
        spec_with(oversampling_factor=float("nan")), [("oversampling_factor", "invalid_value")]
    ),
}


@pytest.mark.parametrize("data,expected", BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_it_refuses_bad_specs_at_the_exact_path(data, expected):
    assert problems_of(data) == expected


def test_the_bad_spec_table_has_at_least_thirty_rows():
    assert len(BAD_SPECS) >= 30


def test_it_reports_every_problem_at_once():
    data = {
        "env": [{"id": "lab/addition"}, {"id": "nope", "extra": 1}],
        "batch_size": 30,
        "sampling": {"temperature": float("nan"), "bar": 2},
        "resources": {"gpus": 2},
        "foo": 1,
    }

    assert sorted(problems_of(data)) == sorted([
        ("model", "required"),
        ("env.1.id", "invalid_value"),
        ("env.1.extra", "unknown_key"),
        ("sampling.temperature", "invalid_value"),
        ("sampling.bar", "unknown_key"),
        ("foo", "unknown_key"),
        ("batch_size", "not_divisible"),
        ("resources.gpus", "invalid_value"),
    ])


def test_it_skips_the_divisibility_rule_for_a_batch_size_already_refused():
    assert problems_of(spec_with(batch_size=-3)) == [("batch_size", "out_of_range")]


def test_it_names_the_unknown_key_and_lists_the_allowed_ones():
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_with(sampling={"top_k": 5}))

    assert caught.value.errors == [SpecProblem(
        "sampling.top_k", "unknown_key",
        "unknown key 'top_k'; allowed keys: max_tokens, temperature, temp_scheduler, extra_body, "
        "enable_thinking, reasoning_effort",
    )]
    assert caught.value.param == "sampling.top_k"


def test_it_explains_type_problems_in_json_terms():
    with pytest.raises(SpecError) as caught:
        parse_spec(spec_with(sampling={"temperature": "1.0"}, env=[{"id": "lab/addition", "args": {"x": {1, 2}}}]))

    assert [problem.message for problem in caught.value.errors] == [
        "Input should be a valid number (got string)",
        "set is not a JSON value (use strings, numbers, booleans, lists, tables)",
    ]


@pytest.mark.parametrize("body,expected", [
    ('"name": "a\\u0000b"', ("name", "invalid_value")),
    ('"name": "\\ud800"', ("name", "invalid_value")),
    ('"metadata": {"team": "a\\u0000"}', ("metadata.team", "invalid_value")),
    ('"metadata": {"te\\u0000am": "a"}', ("metadata.te\\x00am", "invalid_value")),
    ('"metadata": {"team": "\\udfff"}', ("metadata.team", "invalid_value")),
    ('"wandb": {"project": "\\ud800"}', ("wandb.project", "invalid_value")),
    ('"wandb": {"\\ud800": 1}', ("wandb.\\ud800", "invalid_value")),
    ('"wandb": {"project": "a\\u0000"}', ("wandb.project", "invalid_value")),
    ('"trajectory_strategy": "\\udfff"', ("trajectory_strategy", "invalid_value")),
    ('"env_files": ["\\ud800"]', ("env_files.0", "invalid_value")),
    ('"sampling": {"\\ud800": 1}', ("sampling", "invalid_value")),
    ('"\\ud800": 1', ("", "invalid_value")),
])
def test_it_refuses_text_a_database_cannot_store(body, expected):
    text = '{"model": "m", "env": [{"id": "lab/addition", "args": {"a": "ok"}}], ' + body + "}"

    with pytest.raises(SpecError) as caught:
        loads_spec(text, "json")

    assert [(problem.param, problem.code) for problem in caught.value.errors] == [expected]
    for problem in caught.value.errors:  # the error body must itself be encodable
        json.dumps(problem.to_dict(), ensure_ascii=False).encode("utf-8")


def test_it_refuses_nul_in_environment_arguments():
    data = spec_with(env=[{"id": "lab/addition", "args": {"words": ["ok", "a\x00"], "k\x00": 1}}])

    assert problems_of(data) == [("env.0.args.words.1", "invalid_value")]


def test_it_refuses_a_spec_that_is_not_an_object():
    assert problems_of([MINIMAL]) == [("", "invalid_type")]


def test_model_validate_applies_the_cross_field_rule_too():
    with pytest.raises(ValueError, match="multiple of rollouts_per_example"):
        JobSpec.model_validate(spec_with(batch_size=30))


# --- files ---------------------------------------------------------------------------------

def file_problems(text, format):
    with pytest.raises(SpecError) as caught:
        loads_spec(text, format)
    return [(problem.param, problem.code) for problem in caught.value.errors]


def test_it_refuses_non_utf8_files():
    assert file_problems(b'model = "caf\xe9"\n', "toml") == [("", "invalid_encoding")]
    assert file_problems(b'{"model": "caf\xe9"}', "json") == [("", "invalid_encoding")]


def test_it_refuses_duplicate_keys():
    toml_text = 'model = "a"\nmodel = "b"\n[[env]]\nid = "lab/addition"\n'
    assert file_problems(toml_text, "toml") == [("", "duplicate_key")]
    assert file_problems('[sampling]\n[sampling]\n', "toml") == [("", "duplicate_key")]
    assert file_problems('{"model": "a", "model": "b"}', "json") == [("", "duplicate_key")]


def test_it_refuses_syntax_errors_with_the_position():
    with pytest.raises(SpecError, match="line 1"):
        loads_spec('model = \n', "toml")
    assert file_problems('{"model": ', "json") == [("", "invalid_syntax")]


def test_it_refuses_deep_nesting_without_a_traceback():
    assert file_problems("[" * 100_000, "json") == [("", "too_deep")]
    assert file_problems("a = " + "[" * 100_000, "toml") == [("", "too_deep")]


def test_it_refuses_a_spec_nested_past_its_depth_before_reading_it():
    deep: list = []
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    with pytest.raises(SpecError) as refused:
        parse_spec(spec_with(max_steps=deep))
    assert [problem.to_dict() for problem in refused.value.errors] == [{
        "param": "max_steps", "code": "too_deep",
        "message": "nested deeper than the 32 levels of tables and arrays a spec may have",
    }]
    at_the_limit = spec_with(max_steps=json.loads("[" * 31 + "]" * 31))  # the spec is level 1
    assert ("max_steps", "invalid_type") in problems_of(at_the_limit)


def test_it_refuses_huge_integers():
    assert file_problems('{"max_steps": 1' + "0" * 5000 + "}", "json") == [("", "out_of_range")]
    problems = file_problems('max_steps = 99999999999999999999\n[[env]]\nid = "lab/a"\n', "toml")
    assert problems == [("model", "required"), ("max_steps", "out_of_range")]


def test_it_refuses_nan_and_infinity_in_files():
    json_text = json.dumps(spec_with(learning_rate=float("nan")))
    assert file_problems(json_text, "json") == [("learning_rate", "invalid_value")]
    toml_text = 'model = "m"\nlearning_rate = inf\n[[env]]\nid = "lab/addition"\n'
    assert file_problems(toml_text, "toml") == [("learning_rate", "invalid_value")]


def test_it_refuses_a_1mb_string_by_its_path():
    text = json.dumps(spec_with(name="x" * 1_000_000))
    assert file_problems(text, "json") == [("name", "too_long")]


def test_it_refuses_files_over_1mib():
    text = json.dumps(spec_with(name="x" * 1_100_000))
    assert file_problems(text, "json") == [("", "too_large")]


def test_it_refuses_toml_datetimes_as_strings():
    text = 'model = 1979-05-27T07:32:00Z\n[[env]]\nid = "lab/addition"\n'
    assert file_problems(text, "toml") == [("model", "invalid_type")]


def test_load_spec_file_picks_the_format_from_the_suffix(tmp_path):
    toml_path = tmp_path / "job.toml"
    toml_path.write_text(DESIGN_EXAMPLE_TOML)
    json_path = tmp_path / "job.json"
    json_path.write_text(json.dumps(MINIMAL))

    assert load_spec_file(toml_path).spec.name == "addition-smollm2"
    assert load_spec_file(json_path).spec.model == "lab/tiny-random-llama"


# --- catalogues ----------------------------------------------------------------------------

@dataclass
class Model:
    context_length: int


@dataclass
class Environment:
    args: dict = field(default_factory=dict)


MODELS = {"lab/tiny-random-llama": Model(256), "HuggingFaceTB/SmolLM2-135M-Instruct": Model(8192)}
ENVIRONMENTS = {
    "lab/addition": Environment({"max_operand": 20, "seed": None, "scale": 1.0}),
    "lab/reverse-text": Environment({}),
}


def catalogue_check(data):
    spec = parse_spec(data).spec
    return catalog_problems(spec, models=MODELS, environments=ENVIRONMENTS)


def test_it_passes_a_spec_that_fits_the_catalogues():
    data = spec_with(env=[{"id": "lab/addition", "args": {"max_operand": 5, "scale": 2}}])
    assert catalogue_check(data) == []


def test_it_refuses_an_unknown_model_listing_the_installed_ones():
    assert catalogue_check(spec_with(model="Qwen/Qwen3-4B")) == [SpecProblem(
        "model", "unknown_model",
        "model 'Qwen/Qwen3-4B' is not in the catalogue; installed models: "
        "HuggingFaceTB/SmolLM2-135M-Instruct, lab/tiny-random-llama",
    )]


def test_it_refuses_an_environment_that_is_not_installed():
    data = spec_with(env=[{"id": "lab/addition"}, {"id": "primeintellect/reverse-text"}])
    assert catalogue_check(data) == [SpecProblem(
        "env.1.id", "unknown_environment",
        "environment 'primeintellect/reverse-text' is not installed; installed environments: "
        "lab/addition, lab/reverse-text",
    )]


def test_it_refuses_env_args_the_environment_does_not_take_or_of_another_type():
    data = spec_with(env=[{"id": "lab/addition", "args": {
        "max_operand": "20", "colour": "red", "seed": [1], "scale": True,
    }}])
    problems = [(p.param, p.code) for p in catalogue_check(data)]
    assert problems == [
        ("env.0.args.max_operand", "invalid_type"),
        ("env.0.args.colour", "unknown_key"),
        ("env.0.args.scale", "invalid_type"),
    ]


def test_it_refuses_max_tokens_beyond_the_model_context():
    data = spec_with(sampling={"max_tokens": 257})
    assert [(p.param, p.code) for p in catalogue_check(data)] == [
        ("sampling.max_tokens", "out_of_range")
    ]
    assert catalogue_check(spec_with(sampling={"max_tokens": 256})) == []


# --- schema --------------------------------------------------------------------------------

def test_the_json_schema_accepts_the_design_example_and_refuses_unknown_keys():
    jsonschema = pytest.importorskip("jsonschema")
    schema = job_spec_json_schema()
    validator = jsonschema.Draft202012Validator(schema)
    example = loads_spec(DESIGN_EXAMPLE_TOML, "toml").to_dict()

    assert list(validator.iter_errors(example)) == []
    assert list(validator.iter_errors(spec_with(epochs=3)))
    assert schema["required"] == ["model", "env"]


# --- property: any JSON value either parses or is refused with encodable problems -----------

VOCABULARY = {
    "required", "invalid_type", "invalid_value", "out_of_range", "too_long", "too_short", "too_deep",
    "unknown_key", "not_divisible", "invalid_encoding", "invalid_syntax", "duplicate_key", "too_large",
}


def _check_outcome(data):
    try:
        parsed = parse_spec(data)
    except SpecError as exc:
        assert exc.errors
        for problem in exc.errors:
            assert isinstance(problem.param, str) and problem.code in VOCABULARY
            json.dumps(problem.to_dict(), ensure_ascii=False, allow_nan=False).encode("utf-8")
        return
    stored = parsed.to_dict()
    json.dumps(stored, ensure_ascii=False, allow_nan=False).encode("utf-8")
    assert parse_spec(stored).to_dict() == stored


def test_any_json_value_in_any_field_is_parsed_or_refused_cleanly():
    hypothesis = pytest.importorskip("hypothesis")
    strategies = hypothesis.strategies
    text = strategies.text(strategies.characters(exclude_categories=()), max_size=20)  # NUL, surrogates too
    scalars = strategies.none() | strategies.booleans() | strategies.integers() | strategies.floats() | text
    values = strategies.recursive(
        scalars,
        lambda children: strategies.lists(children, max_size=4) | strategies.dictionaries(text, children, max_size=4),
        max_leaves=20,
    )
    field_paths = [
        ("name",), ("model",), ("max_steps",), ("batch_size",), ("learning_rate",), ("priority",), ("init_from",),
        ("sampling",), ("sampling", "temperature"), ("env",), ("env", 0), ("env", 0, "id"), ("env", 0, "args"),
        ("metadata",), ("resources",), ("resources", "gpus"), ("wandb",), ("oversampling_factor",), (),
    ]

    @hypothesis.settings(max_examples=150, derandomize=True, deadline=None, database=None)
    @hypothesis.given(path=strategies.sampled_from(field_paths), value=values, key=text)
    def check(path, value, key):
        data = json.loads(json.dumps(MINIMAL))
        if not path:
            data[key] = value
        else:
            holder = data
            for part in path[:-1]:
                holder = holder.setdefault(part, {}) if isinstance(part, str) else holder[part]
            holder[path[-1]] = value
        _check_outcome(data)

    check()


def test_any_bytes_as_a_spec_file_are_parsed_or_refused_cleanly():
    hypothesis = pytest.importorskip("hypothesis")
    strategies = hypothesis.strategies
    toml_like = strategies.lists(
        strategies.sampled_from(['model = "m"', "[[env]]", 'id = "lab/addition"', "[sampling]", "max_tokens = 9",
                                 "a = [[[1]]]", "a = 1", "x = nan", "= 1", '"\\ud800" = 1', "[a.b]", "[a]", "}"]),
        max_size=8,
    ).map("\n".join)
    any_text = strategies.text(strategies.characters(exclude_categories=()), max_size=64)
    documents = strategies.binary(max_size=64) | toml_like | any_text

    @hypothesis.settings(max_examples=150, derandomize=True, deadline=None, database=None)
    @hypothesis.given(document=documents, format=strategies.sampled_from(["toml", "json"]))
    def check(document, format):
        try:
            loads_spec(document, format)
        except SpecError as exc:
            assert exc.errors
            for problem in exc.errors:
                assert problem.code in VOCABULARY
                json.dumps(problem.to_dict(), ensure_ascii=False).encode("utf-8")

    check()


def test_whole_numbers_written_as_floats_count_as_integers_outside_free_form_tables():
    # JSON does not tell 20.0 from 20, and the JSON Schema's "integer" accepts both.
    spec = parse_spec({**MINIMAL, "max_steps": 20.0, "max_restarts": 0.0, "env": [{"id": "lab/addition", "args": {"scale": 2.0}}]})
    data = spec.to_dict()
    assert data["max_steps"] == 20 and isinstance(data["max_steps"], int)
    assert data["max_restarts"] == 0
    assert data["env"][0]["args"] == {"scale": 2.0}  # an environment's own arguments keep their JSON type
    with pytest.raises(SpecError) as refused:
        parse_spec({**MINIMAL, "max_steps": 20.5})
    assert [problem.param for problem in refused.value.errors] == ["max_steps"]


def test_the_json_schema_says_a_v1_taskset_needs_an_id():
    import jsonschema

    schema = job_spec_json_schema()
    validator = jsonschema.Draft202012Validator(schema)
    base = {"model": "lab/tiny-random-llama"}
    assert validator.is_valid({**base, "env": [{"id": "lab/addition"}]})
    assert validator.is_valid({**base, "env": [{"taskset": {"id": "lab/addition"}}]})
    assert not validator.is_valid({**base, "env": [{"taskset": {"name": "x"}}]})
