"""``prime eval push`` (``prime==0.18.0``) and the ``prime-evals`` SDK (0.2.4) pushing to Lab what
verifiers 0.3.1's own ``vf-eval`` wrote (run for real against the engine's serving role on the
tiny model), then finalizing and reading it back: each client's own code in this process, every
request recorded (tests/support/prime_clients.py). Prime's clients upload samples from worker
threads, whose database connections must see the test's rows: these tests commit."""

from __future__ import annotations

import json

import pytest
from prime_evals import APIClient, EvalsAPIError, EvalsClient

from evaluations.models import Evaluation, Source
from jobs.evaluation_samples import EvaluationSample
from tests.support.prime_clients import prime_cli, prime_http  # noqa: F401
from tests.support.vf_eval import legacy_verifiers_python, run_legacy_vf_eval, serving_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]

API = "/prime/api/v1"


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A verifiers 0.3.1 vf-eval run: 3 examples x 2 rollouts of tiny_count on the tiny model."""
    root = tmp_path_factory.mktemp("prime-push")
    with serving_url(root / "serve") as url:
        return run_legacy_vf_eval(legacy_verifiers_python(root), url, root / "legacy", num_examples=3, rollouts=2)


def _rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]


def test_prime_eval_push_stores_the_run_as_a_finalized_lab_evaluation(prime_http, owner, run_folder):  # noqa: F811
    rows = _rows(run_folder)

    pushed = prime_cli(owner.key, "eval", "push", str(run_folder), "--env", "lab/addition", "--name", "tiny-count-local")
    samples = prime_cli(owner.key, "eval", "samples", "-n", "4", Evaluation.objects.unscoped().get().public_id)

    assert pushed.exit_code == 0, pushed.output
    evaluation = Evaluation.objects.unscoped().select_related("job").get()
    assert f"Evaluation ID: {evaluation.public_id}" in pushed.output
    assert f"/evaluations/{evaluation.public_id}/" in pushed.output  # View results: Lab's page
    assert (evaluation.source, evaluation.name, evaluation.target_id) == (Source.PUSHED, "tiny-count-local", "lab/tiny-random-llama")
    assert evaluation.environments == [{"id": "lab/addition", "args": {"num_examples": 3}, "num_examples": 3, "rollouts_per_example": 2}]
    assert evaluation.job.finished_at is not None and evaluation.results["lab/addition"]["samples"] == len(rows) == 6
    stored = {(sample.example, sample.rollout): sample for sample in EvaluationSample.objects.unscoped().filter(job=evaluation.job_id)}
    for example in range(3):
        mine = [row for row in rows if row["example_id"] == example]
        assert sorted(sample.reward for key, sample in stored.items() if key[0] == example) == sorted(row["reward"] for row in mine)
        assert {stored[(example, 0)].completion, stored[(example, 1)].completion} == {row["completion"][-1]["content"] for row in mine}
    assert prime_http.calls() == [
        ("GET", f"{API}/environmentshub/lab/addition/@latest"),
        ("POST", f"{API}/evaluations/"),
        ("POST", f"{API}/evaluations/{evaluation.public_id}/samples"),
        ("POST", f"{API}/evaluations/{evaluation.public_id}/finalize"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}/samples"),
    ]
    created = prime_http.requests[1].body
    assert (created["model_name"], created["environments"], created["framework"]) == ("lab/tiny-random-llama", [{"id": "lab/addition"}], "verifiers")
    assert samples.exit_code == 0
    page = json.loads(samples.output)
    assert (page["total"], len(page["samples"]), page["has_more"]) == (6, 4, True)


def test_the_prime_evals_sdk_creates_pushes_finalizes_and_reads_an_evaluation(prime_http, owner, monkeypatch, run_folder):  # noqa: F811
    rows = _rows(run_folder)
    monkeypatch.setenv("PRIME_API_KEY", owner.key)
    client = EvalsClient(APIClient())

    created = client.create_evaluation(
        name="reverse-local", environments=[{"slug": "lab/reverse-text"}], model_name="gpt-4.1-mini", framework="verifiers",
        metadata={"env_id": "reverse-text", "sampling_args": {"temperature": 0.2, "max_tokens": 32}}, metrics={"reward": 0.5},
    )
    pushed = client.push_samples(created["evaluation_id"], rows)
    again = client.push_samples(created["evaluation_id"], rows[:1])  # one more rollout of its example
    done = client.finalize_evaluation(created["evaluation_id"], metrics={"reward": 0.5})
    listed = client.list_evaluations(env_name="reverse-text")
    fetched = client.get_evaluation(created["evaluation_id"])
    page = client.get_samples(created["evaluation_id"], page=2, limit=4)

    assert (pushed, again) == ({"samples_pushed": 6, "samples_skipped": 0}, {"samples_pushed": 1, "samples_skipped": 0})
    evaluation = Evaluation.objects.unscoped().get(public_id=created["evaluation_id"])
    assert (evaluation.source, evaluation.target_id, evaluation.sampling["temperature"]) == (Source.PUSHED, "gpt-4.1-mini", 0.2)
    assert evaluation.environments == [{"id": "lab/reverse-text", "args": {}, "num_examples": 3, "rollouts_per_example": 3}]
    rewards = [row["reward"] for row in rows] + [rows[0]["reward"]]
    assert (done["status"], done["total_samples"], done["is_hosted"]) == ("COMPLETED", 7, False)
    assert done["metrics"]["avg_reward"] == pytest.approx(sum(rewards) / 7)
    assert done["viewer_url"].endswith(f"/evaluations/{evaluation.public_id}/")
    assert [item["evaluation_id"] for item in listed["evaluations"]] == [evaluation.public_id]
    assert fetched["status"] == "COMPLETED" and fetched["environment_names"] == ["lab/reverse-text"]
    assert (page["total"], page["page"], len(page["samples"]), page["has_more"]) == (7, 2, 3, False)
    first = rows[0]
    extra = EvaluationSample.objects.unscoped().get(job=evaluation.job_id, example=first["example_id"], rollout=2)
    assert (extra.completion, extra.reward, extra.prompt_tokens) == (
        first["completion"][-1]["content"], first["reward"], first["token_usage"]["input_tokens"],
    )
    assert prime_http.calls() == [
        ("GET", f"{API}/environmentshub/lab/reverse-text/@latest"),
        ("POST", f"{API}/evaluations/"),
        ("POST", f"{API}/evaluations/{evaluation.public_id}/samples"),
        ("POST", f"{API}/evaluations/{evaluation.public_id}/samples"),
        ("POST", f"{API}/evaluations/{evaluation.public_id}/finalize"),
        ("GET", f"{API}/evaluations/"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}"),
        ("GET", f"{API}/evaluations/{evaluation.public_id}/samples"),
    ]
    with pytest.raises(EvalsAPIError, match="HTTP 409"):
        client.push_samples(evaluation.public_id, rows[:1])


def test_another_organizations_evaluation_and_environment_are_missing_to_the_sdk(prime_http, owner, outsider, monkeypatch, run_folder):  # noqa: F811
    rows = _rows(run_folder)
    monkeypatch.setenv("PRIME_API_KEY", outsider.key)
    theirs = EvalsClient(APIClient()).create_evaluation(name="theirs", environments=[{"slug": "lab/addition"}], model_name="m")
    monkeypatch.setenv("PRIME_API_KEY", owner.key)
    client = EvalsClient(APIClient())

    with pytest.raises(Exception, match="HTTP 404: No such evaluation."):
        client.get_evaluation(theirs["evaluation_id"])
    with pytest.raises(EvalsAPIError, match="HTTP 404"):
        client.push_samples(theirs["evaluation_id"], rows[:1])
    with pytest.raises(Exception, match="All provided environments lack valid identifiers"):
        client.create_evaluation(name="x", environments=[{"slug": "globex/private-env"}], model_name="m")
    assert client.list_evaluations()["evaluations"] == []
    assert EvaluationSample.objects.unscoped().count() == 0
