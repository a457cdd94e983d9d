"""Prime configs through the API: warnings in the create and estimate answers, a translated
layout kept as submitted on the job, and Prime's refusals as 400s that create nothing."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db

NATIVE = (Path(__file__).parents[1] / "sdk" / "data" / "prime" / "reverse-text-rl.toml").read_text()


def native_config() -> dict:
    text = NATIVE.replace("PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT", "lab/tiny-random-llama")
    config = tomllib.loads(text.replace('{ id = "reverse-text-v1" }', '{ id = "lab/reverse-text" }'))
    config["orchestrator"]["batch_size"] = 16
    return config


def test_it_creates_a_job_from_prime_rls_native_layout_and_keeps_the_original(owner):
    config = native_config()

    response = owner.client().post("/api/v1/jobs", config, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.unscoped().get()
    assert job.spec["translated_from"] == {"layout": "prime-rl", "config": config}
    assert body["spec"]["translated_from"]["config"] == config
    assert (job.spec["model"], job.spec["batch_size"], job.spec["rollouts_per_example"]) == (
        "lab/tiny-random-llama", 16, 16,
    )
    assert body["warnings"] == job.warnings
    assert body["warnings"][0].startswith("this is prime-rl's native layout")
    assert any(warning.startswith("'orchestrator.renderer'") for warning in body["warnings"])


def test_estimate_answers_the_same_warnings_as_create(owner):
    spec = {
        "model": "lab/tiny-random-llama", "env": [{"id": "lab/addition"}], "max_steps": 3,
        "wandb": {"project": "p"}, "val": {"interval": 2}, "checkpoint_id": None,
    }

    estimate = owner.client().post("/api/v1/jobs/estimate", spec, format="json")
    created = owner.client().post("/api/v1/jobs", spec, format="json")

    assert estimate.status_code == 200, estimate.content
    assert created.status_code == 201, created.content
    assert estimate.json()["warnings"] == created.json()["warnings"]
    assert [warning.split("'")[1] for warning in estimate.json()["warnings"]] == ["wandb"]


@pytest.mark.parametrize("keys, param", [
    ({"checkpoint_id": "ckpt_a", "init_from": "ckpt_b"}, "checkpoint_id"),
    ({"checkpoints": {"keep_cloud": 1, "keep_last": 2}}, "checkpoints.keep_cloud"),
    ({"loss": "opd"}, "loss"),
    ({"teacher": {"model": "t"}}, "teacher"),
    ({"max_inflight_rollouts": 8, "oversampling_factor": 2.0}, "oversampling_factor"),
    ({"sampling": {"temp_scheduler": {"start_temperature": 1.0, "end_temperature": -1.0}}},
     "sampling.temp_scheduler.end_temperature"),
    ({"sampling": {"temp_scheduler": {"start_temperature": 1.0, "end_temperature": 0.5, "total_steps": 4}}},
     "sampling.temp_scheduler.total_steps"),
    ({"eval": {"interval": 1, "env": [{"id": "primeintellect/eval-env"}]}}, "eval.env.0.id"),
    ({"eval": {"interval": 1, "env": [{"id": "lab/addition", "args": {"digits": 2}}]}}, "eval.env.0.args.digits"),
    ({"eval": {"env": [{"id": "lab/addition", "group_size": 2, "rollouts_per_example": 2}]}}, "eval.env.0.group_size"),
    ({"sampling": {"extra_body": {"top_p": 0}}}, "sampling.extra_body.top_p"),
    ({"env": [{"id": "lab/addition", "timeout": 0}]}, "env.0.timeout"),
    ({"batch_size": 8, "env": [{"id": "lab/addition"}, {"id": "lab/reverse-text", "group_size": 3}]}, "env.1.group_size"),
    ({"env": [{"id": "lab/addition"}, {"id": "lab/reverse-text", "timeout": 86_401}]}, "env.1.timeout"),
    ({"post_batch_filters": [{"type": "repetition", "ngram_size": "4"}]}, "post_batch_filters.0.ngram_size"),
])
def test_primes_refusals_are_a_400_naming_the_key_and_create_nothing(owner, keys, param):
    spec = {"model": "lab/tiny-random-llama", "env": [{"id": "lab/addition"}], "max_steps": 3, **keys}

    response = owner.client().post("/api/v1/jobs", spec, format="json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    assert Job.objects.unscoped().count() == 0


def test_an_eval_environments_split_argument_is_left_out_with_a_warning(owner):
    spec = {
        "model": "lab/tiny-random-llama", "env": [{"id": "lab/addition"}], "max_steps": 3,
        "eval": {"interval": 1, "env": [{"id": "lab/alphabet-sort", "args": {"split": "test"}, "num_examples": -1}]},
    }

    response = owner.client().post("/api/v1/jobs", spec, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["spec"]["eval"]["env"][0]["args"] == {"split": "test"}  # stored as given
    assert body["spec"]["eval"]["env"][0]["num_examples"] == -1
    assert [warning.split("'")[1] for warning in body["warnings"]] == ["eval.env.0.args.split"]


def test_the_older_cli_forms_seq_len_is_capped_at_the_models_context(owner):
    text = (Path(__file__).parents[1] / "sdk" / "data" / "prime" / "rl_config.toml").read_text()
    config = tomllib.loads(text)
    config.update(model="lab/tiny-random-llama", environments=["lab/addition"], max_steps=2)

    response = owner.client().post("/api/v1/jobs", config, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["spec"]["sampling"]["max_tokens"] == 512  # the tiny model's context, not seq_len = 4096
    assert body["spec"]["rollouts_per_example"] == 8
    assert body["warnings"][-1] == "'seq_len' = 4096 is longer than the model's context: sampling.max_tokens is capped at 512"
    assert body["spec"]["translated_from"]["config"] == config


def test_an_explicit_max_tokens_over_the_context_is_still_refused(owner):
    config = {"model": "lab/tiny-random-llama", "environments": ["lab/addition"], "seq_len": 4096,
              "sampling": {"max_tokens": 4096}}

    response = owner.client().post("/api/v1/jobs", config, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "sampling.max_tokens"
