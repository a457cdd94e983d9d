"""Prime's evaluation clients against Lab's Prime-compatible API: ``prime eval run --hosted``,
``list``, ``get``, ``logs`` and ``stop`` of ``prime==0.18.0``, the client's own code running in this
process with every request it made recorded (tests/support/prime_clients.py); pushes, whose
samples Prime's clients send from threads, are in test_prime_evals_push.py."""

from __future__ import annotations

import json

import pytest

from evaluations.models import Evaluation, Source
from jobs.evaluation_samples import EvaluationSample
from jobs.models import JobStatus
from jobs.services import store_log_lines
from lab.audit import Actor
from lab.services import api_key_create
from tests.support.prime_clients import prime_cli, prime_http  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

API = "/prime/api/v1"


def test_prime_eval_run_hosted_queues_a_lab_evaluation_that_every_command_reads_and_stop_cancels(prime_http, owner, outsider):  # noqa: F811
    started = prime_cli(owner.key, "eval", "run", "lab/addition", "--hosted", "-m", "lab/tiny-random-llama", "-n", "3", "-r", "2",
                        "-a", '{"max_operand": 9}', "--eval-name", "addition-baseline")

    assert started.exit_code == 0, started.output
    evaluation = Evaluation.objects.unscoped().select_related("job").get()
    assert f"Evaluation ID: {evaluation.public_id}" in started.output
    assert prime_http.calls() == [
        ("GET", f"{API}/environmentshub/lab/addition/@latest"),
        ("POST", f"{API}/hosted-evaluations"),
    ]
    sent = prime_http.requests[1].body
    assert sent["environment_ids"] == ["lab/addition"] and sent["inference_model"] == "lab/tiny-random-llama"
    assert (sent["eval_config"]["num_examples"], sent["eval_config"]["rollouts_per_example"]) == (3, 2)
    assert (evaluation.source, evaluation.name, evaluation.target_id) == (Source.LAB, "addition-baseline", "lab/tiny-random-llama")
    assert evaluation.environments == [{"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2}]
    store_log_lines(job=evaluation.job, attempt_number=1, source="engine", lines=[(0, evaluation.created_at, "stdout", "loading the model")])

    listed = prime_cli(owner.key, "eval", "list", "-o", "json")
    got = prime_cli(owner.key, "eval", "get", evaluation.public_id)
    logs = prime_cli(owner.key, "eval", "logs", evaluation.public_id)
    stopped = prime_cli(owner.key, "eval", "stop", evaluation.public_id)
    after = prime_cli(owner.key, "eval", "get", evaluation.public_id)
    foreign = prime_cli(outsider.key, "eval", "get", evaluation.public_id)

    assert [result.exit_code for result in (listed, got, logs, stopped, after)] == [0] * 5
    (item,) = json.loads(listed.output)["evaluations"]
    assert (item["evaluation_id"], item["status"], item["is_hosted"], item["environment_names"]) == (
        evaluation.public_id, "PENDING", True, ["lab/addition"],
    )
    assert json.loads(got.output)["metadata"]["num_examples"] == 3
    assert "loading the model" in logs.output and "Status: PENDING" in logs.output
    assert f"Evaluation {evaluation.public_id} is cancelled." in stopped.output
    assert json.loads(after.output)["status"] == "CANCELLED"
    assert foreign.exit_code == 1 and "HTTP 404: No such evaluation." in foreign.output
    evaluation.job.refresh_from_db()
    assert evaluation.job.status == JobStatus.CANCELLED
    assert prime_http.calls()[2:] == [
        ("GET", f"{API}/evaluations/"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}"),
        ("GET", f"{API}/hosted-evaluations/{evaluation.public_id}/logs"),
        ("PATCH", f"{API}/hosted-evaluations/{evaluation.public_id}/cancel"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}"),
    ]


def test_a_hosted_run_lab_cannot_do_is_refused_naming_each_reason_and_creates_nothing(prime_http, owner):  # noqa: F811
    unknown = prime_cli(owner.key, "eval", "run", "primeintellect/gsm8k", "--hosted", "-m", "lab/tiny-random-llama")
    endpoint = prime_cli(owner.key, "eval", "run", "lab/addition", "--hosted", "-m", "lab/tiny-random-llama",
                         "-b", "https://api.openai.com/v1", "--custom-secrets", '{"OPENAI_API_KEY": "sk-x"}')
    bad_model = prime_cli(owner.key, "eval", "run", "lab/addition", "--hosted", "-m", "openai/gpt-4.1-mini")

    assert unknown.exit_code == 1 and "hosted evaluations require an environment that is published" in unknown.output
    assert endpoint.exit_code == 1
    assert "eval_config.custom_secrets: an evaluation of a catalogue model takes no secrets here" in endpoint.output
    assert "eval_config.api_base_url: Lab evaluates its catalogue models and checkpoints" in endpoint.output
    assert bad_model.exit_code == 1 and "model.id" in bad_model.output
    assert not Evaluation.objects.unscoped().exists()


def test_create_bodies_lab_cannot_take_are_a_422_and_create_nothing(prime_http, owner):  # noqa: F811
    response_run = owner.client().post(f"{API}/evaluations/", {"name": "x", "run_id": "run_1", "model_name": "m"}, format="json")
    response_public = owner.client().post(
        f"{API}/evaluations/", {"name": "x", "environments": [{"id": "lab/addition"}], "model_name": "m", "is_public": True}, format="json",
    )
    response_two = owner.client().post(
        f"{API}/evaluations/", {"name": "x", "environments": [{"id": "a"}, {"id": "b"}], "model_name": "m"}, format="json",
    )

    assert [response.status_code for response in (response_run, response_public, response_two)] == [422, 422, 422]
    assert response_run.json()["detail"][0]["loc"] == ["body", "run_id"]
    assert response_public.json()["detail"][0]["loc"] == ["body", "is_public"]
    assert not Evaluation.objects.unscoped().exists()


def test_prime_sample_batches_past_lab_limits_are_taken_whole_or_not_at_all(owner):
    created = owner.client().post(
        f"{API}/evaluations/", {"name": "big", "environments": [{"id": "lab/addition"}], "model_name": "m"}, format="json",
    ).json()
    rows = [
        {"example_id": example, "prompt": [{"role": "user", "content": "x" * 900}], "completion": [{"role": "assistant", "content": "y"}],
         "reward": 1.0, "metrics": {"correct": 1.0}}
        for example in range(1500)
    ]
    bad = [*rows[:1200], {"example_id": "seven", "reward": 0.0}]

    refused = owner.client().post(f"{API}/evaluations/{created['evaluation_id']}/samples", {"samples": bad}, format="json")
    taken = owner.client().post(f"{API}/evaluations/{created['evaluation_id']}/samples", {"samples": rows}, format="json")
    lab_route = owner.client().post(f"/api/v1/evaluations/{created['evaluation_id']}/samples", {"samples": rows[:1]}, format="json")
    too_big = owner.client().post(
        f"/api/v1/evaluations/{created['evaluation_id']}/samples", {"samples": [{"x": "z" * 1_100_000}]}, format="json",
    )

    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "samples", 1200, "example_id"]
    assert taken.status_code == 200, taken.content[:300]
    assert taken.json() == {"samples_pushed": 1500, "duplicates": 0}
    assert (lab_route.status_code, too_big.status_code) == (400, 413)  # Lab's own route keeps its limits
    assert EvaluationSample.objects.unscoped().count() == 1500


def test_a_read_key_reads_evaluations_but_cannot_start_push_or_stop_one(owner):
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    client = owner.client(key)

    hosted = client.post(f"{API}/hosted-evaluations", {"environment_ids": ["lab/addition"], "inference_model": "lab/tiny-random-llama",
                                                       "eval_config": {"num_examples": 1, "rollouts_per_example": 1}}, format="json")
    pushed = client.post(f"{API}/evaluations/", {"name": "x", "environments": [{"id": "lab/addition"}], "model_name": "m"}, format="json")
    listed = client.get(f"{API}/evaluations/")
    found = client.get(f"{API}/environmentshub/lab/addition/@latest")

    assert (hosted.status_code, pushed.status_code, listed.status_code) == (403, 403, 200)
    assert found.json() == {"data": {"id": "lab/addition", "owner": "lab", "name": "addition", "version": "builtin"}}
    assert not Evaluation.objects.unscoped().exists()
