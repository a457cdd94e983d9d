"""Evaluations against a hostile caller (docs/evaluations.md): bodies of wrong types, sizes and
characters, keys of the wrong scope, another organization's ids, tampered cursors and filters, and
an engine reporting samples with another job's token, outside its plan or after its end. Each is a
clean 4xx that creates and changes nothing. Concurrent creates under one ``Idempotency-Key`` run in
threads, so that test commits (``transaction=True``); the others roll back."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections
from labsdk.cli import main as cli_main
from rest_framework.test import APIClient

from evaluations.models import Evaluation
from evaluations.selectors import evaluation_reward_histogram
from jobs.evaluation_samples import EvaluationSample
from jobs.models import Job, JobStatus
from jobs.services import job_transition
from lab.audit import Actor
from lab.services import api_key_create
from tests.support.evaluations import EvaluationEngine, create_evaluation, evaluation_body, every_sample, sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

BASE = "/api/v1/evaluations"


def nothing_created() -> bool:
    return not Evaluation.objects.unscoped().exists() and not Job.objects.unscoped().exists()


def environment(**changes) -> dict:
    return {"id": "lab/addition", "num_examples": 2, **changes}


@pytest.mark.parametrize(
    "changes, param",
    [
        ({"name": "x" * 129}, "name"),
        ({"name": 7}, "name"),
        ({"name": "nul\x00name"}, "name"),
        ({"name": "lone \ud800 surrogate"}, "name"),
        ({"metadata": {"team": "a\x00b"}}, "metadata.team"),
        ({"metadata": {"team": "lone \udc00"}}, "metadata.team"),
        ({"metadata": {"t\x00eam": "research"}}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(33)}}, "metadata"),
        ({"metadata": {"team": "x" * 513}}, "metadata.team"),
        ({"metadata": ["team"]}, "metadata"),
        ({"model": {"type": "checkpoint", "id": "ckpt_\x00"}}, "model.id"),
        ({"model": {"type": "checkpoint", "id": "ckpt_\ud800"}}, "model.id"),
        ({"model": {"type": "model", "id": "lab/tiny\x00"}}, "model.id"),
        ({"model": {"type": "model", "id": "x" * 257}}, "model.id"),
        ({"model": {"type": "galaxy", "id": "x"}}, "model.type"),
        ({"model": "lab/tiny-random-llama"}, "model"),
        ({"environments": {"id": "lab/addition"}}, "environments"),
        ({"environments": [environment(id=f"lab/env-{i}") for i in range(17)]}, "environments"),
        ({"environments": [environment(num_examples=10**30)]}, "environments.0.num_examples"),
        ({"environments": [environment(num_examples=10_001)]}, "environments.0.num_examples"),
        ({"environments": [environment(num_examples=-2)]}, "environments.0.num_examples"),
        ({"environments": [environment(num_examples="most")]}, "environments.0.num_examples"),
        ({"environments": [environment(num_examples=2.5)]}, "environments.0.num_examples"),
        ({"environments": [environment(num_examples=True)]}, "environments.0.num_examples"),
        ({"environments": [environment(rollouts_per_example=10**18)]}, "environments.0.rollouts_per_example"),
        ({"environments": [environment(rollouts_per_example=0)]}, "environments.0.rollouts_per_example"),
        ({"environments": [environment(rollouts_per_example="2")]}, "environments.0.rollouts_per_example"),
        ({"environments": [environment(id="lab/\x00addition")]}, "environments.0.id"),
        ({"environments": [environment(id="x" * 300)]}, "environments.0.id"),
        ({"environments": [environment(args={"max_operand": "\x00"})]}, "environments.0.args.max_operand"),
        ({"environments": [environment(args={"\x00": 1})]}, "environments.0.args.\\x00"),
        ({"environments": [environment(args=[1, 2])]}, "environments.0.args"),
        ({"sampling": {"max_tokens": 10**12}}, "sampling.max_tokens"),
        ({"sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
        ({"sampling": {"temperature": "hot"}}, "sampling.temperature"),
        ({"sampling": {"seed": -1}}, "sampling.seed"),
        ({"sampling": {"seed": 2**64}}, "sampling.seed"),
        ({"resources": {"gpus": 10**9}}, "resources.gpus"),
        ({"resources": {"gpu_type": "h100\x00"}}, "resources.gpu_type"),
    ],
)
def test_a_hostile_body_is_a_clean_400_naming_the_field_and_creates_nothing(owner, changes, param):
    response = owner.client().post(BASE, json.dumps(evaluation_body(**changes)), content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param), error
    assert nothing_created()


@pytest.mark.parametrize("raw", ["{not json", "[]", "null", '"a string"', "12", '{"model": NaN}', "\x00", "{" * 5000])
def test_a_body_that_is_no_json_object_is_a_400(owner, raw):
    response = owner.client().post(BASE, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert nothing_created()


def test_unicode_names_and_metadata_are_kept_as_sent(owner):
    body = evaluation_body(name="évaluation 評価 🚀", metadata={"équipe": "数学 ✓"})
    created = owner.client().post(BASE, body, format="json").json()
    assert (created["name"], created["metadata"]) == ("évaluation 評価 🚀", {"équipe": "数学 ✓"})


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_under_one_idempotency_key_create_one_evaluation(owner, default_prices):
    answers, barrier = [], threading.Barrier(4)

    def create():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {owner.key}", HTTP_IDEMPOTENCY_KEY="evaluate-once")
        barrier.wait()
        try:
            response = client.post(BASE, evaluation_body(), format="json")
            answers.append((response.status_code, response.json().get("id")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    evaluation = Evaluation.objects.unscoped().get()
    assert Job.objects.unscoped().count() == 1
    assert answers == [(201, evaluation.public_id)] * 4


@pytest.mark.parametrize("scopes", [["read"], ["inference"]])
def test_keys_without_write_change_nothing(owner, scopes):
    evaluation = create_evaluation(owner)
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="limited", scopes=scopes)
    client, url = owner.client(key), f"{BASE}/{evaluation.public_id}"
    assert client.post(BASE, evaluation_body(), format="json").status_code == 403
    assert client.post(f"{url}/cancel").status_code == 403
    assert client.delete(url).status_code == 403
    job_transition(job=Job.objects.unscoped().get(pk=evaluation.job_id), to=JobStatus.CANCELLED)
    assert client.post(f"{url}/retry").status_code == 403
    assert client.delete(url).status_code == 403
    assert Evaluation.objects.unscoped().count() == 1
    assert Job.objects.unscoped().get(pk=evaluation.job_id).status == JobStatus.CANCELLED


def test_an_inference_key_reads_nothing(owner):
    evaluation = create_evaluation(owner)
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="app", scopes=["inference"])
    assert owner.client(key).get(BASE).status_code == 403
    assert owner.client(key).get(f"{BASE}/{evaluation.public_id}/samples").status_code == 403


@pytest.mark.parametrize(
    "evaluation_id", ["eval_" + "x" * 5000, "eval_\u00e9\u8a55", "../evaluations", "eval_%00", "' OR 1=1 --"]
)
def test_odd_ids_are_not_found(owner, evaluation_id):
    create_evaluation(owner)
    for method, suffix in [("get", ""), ("get", "/samples"), ("post", "/cancel"), ("post", "/retry"), ("delete", "")]:
        response = getattr(owner.client(), method)(f"{BASE}/{evaluation_id}{suffix}")
        assert response.status_code in (400, 404), (method, suffix, response.content)
    assert Evaluation.objects.unscoped().count() == 1


def test_cursors_of_other_lists_and_other_tenants_are_not_found(owner, outsider):
    mine, theirs = create_evaluation(owner), create_evaluation(outsider)
    other = create_evaluation(owner)
    EvaluationEngine(theirs.job).evaluation_samples(every_sample(theirs)[:1])
    EvaluationEngine(other.job).evaluation_samples(every_sample(other)[:1])
    their_sample = EvaluationSample.objects.get(job=theirs.job).public_id
    other_sample = EvaluationSample.objects.get(job=other.job).public_id
    client = owner.client()
    foreign = client.get(BASE, {"after": theirs.public_id})
    missing = client.get(BASE, {"after": "eval_doesnotexist"})
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["error"]["message"].split(":")[0] == missing.json()["error"]["message"].split(":")[0]
    samples = f"{BASE}/{mine.public_id}/samples"
    assert client.get(samples, {"after": their_sample}).status_code == 404
    assert client.get(samples, {"after": other_sample}).status_code == 404  # another evaluation's sample
    assert client.get(samples, {"after": mine.public_id}).status_code == 404  # not a sample at all
    assert client.get(samples, {"after": "evs_" + "x" * 10_000}).status_code == 404
    assert client.get(BASE, {"after": "eval\x00"}).status_code == 400
    for limit in ("-1", "0", "abc", "1e3", str(10**30)):
        assert client.get(BASE, {"limit": limit}).status_code == 400, limit


@pytest.mark.parametrize("bound", ["nan", "NaN", "inf", "-inf", "Infinity", "lots", "1e999", "0x10", "[1]"])
def test_reward_filters_that_are_no_finite_number_are_a_400(owner, bound):
    evaluation = create_evaluation(owner)
    url = f"{BASE}/{evaluation.public_id}/samples"
    for name in ("min_reward", "max_reward"):
        response = owner.client().get(url, {name: bound})
        assert response.status_code == 400, (name, bound, response.content)
        assert response.json()["error"]["param"] == name


def test_an_environment_filter_of_any_shape_is_a_400_or_empty(owner):
    evaluation = create_evaluation(owner)
    url = f"{BASE}/{evaluation.public_id}/samples"
    for value in ("x" * 10_000, "lab/addition\n", "é"):
        assert owner.client().get(url, {"environment": value}).status_code == 400
    assert owner.client().get(BASE, {"status": "x" * 10_000}).status_code == 400


def test_another_jobs_token_stores_nothing_in_this_evaluation(owner, outsider):
    mine, theirs = create_evaluation(owner), create_evaluation(outsider)
    engine = EvaluationEngine(theirs.job)
    EvaluationEngine(mine.job)  # claimed, so it would take samples from its own token
    response = engine.client.post(
        f"/api/v1/ingest/jobs/{mine.job.public_id}/evaluation-samples",
        {"attempt": 1, "samples": every_sample(mine)}, format="json",
    )
    assert response.status_code in (401, 403, 404), response.content
    assert not EvaluationSample.objects.unscoped().exists()


def test_an_owner_api_key_cannot_report_samples(owner):
    evaluation = create_evaluation(owner)
    EvaluationEngine(evaluation.job)
    response = owner.client().post(
        f"/api/v1/ingest/jobs/{evaluation.job.public_id}/evaluation-samples",
        {"attempt": 1, "samples": every_sample(evaluation)}, format="json",
    )
    assert response.status_code in (401, 403), response.content
    assert not EvaluationSample.objects.unscoped().exists()


@pytest.mark.parametrize(
    "changes",
    [
        {"environment": 255}, {"environment": -1}, {"example": 10**9}, {"rollout": 10**9}, {"num_examples": 0},
        {"num_examples": 10**12}, {"reward": float("inf")}, {"reward": None}, {"reward": True},
        {"completion": "x" * 300_000}, {"completion": 5}, {"prompt": [{"role": "user", "content": "a\x00"}]},
        {"functions": {"correct": float("nan")}}, {"functions": {"x" * 300: 1.0}}, {"prompt_tokens": -1},
        {"latency_s": -0.5}, {"info": {"\x00": 1}}, {"truncated": "yes"}, {"attempt": 1},
    ],
)
def test_a_sample_out_of_plan_or_shape_stores_nothing(owner, changes):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    batch = [sample(0, 0, 0, num_examples=3), {**sample(0, 1, 0, num_examples=3), **changes}]
    body = json.dumps({"attempt": 1, "samples": batch}, allow_nan=True)
    response = engine.client.post(f"{engine.base}/evaluation-samples", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert not EvaluationSample.objects.unscoped().exists()


def test_a_batch_of_another_attempt_or_too_many_samples_stores_nothing(owner):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    url = f"{engine.base}/evaluation-samples"
    rows = every_sample(evaluation)
    assert engine.client.post(url, {"attempt": 2, "samples": rows}, format="json").status_code in (400, 409)
    assert engine.client.post(url, {"attempt": "1", "samples": rows}, format="json").status_code == 400
    too_many = [rows[0]] * 1_001
    assert engine.client.post(url, {"attempt": 1, "samples": too_many}, format="json").status_code == 413
    assert engine.client.post(url, {"attempt": 1, "samples": {"0": rows[0]}}, format="json").status_code == 400
    assert not EvaluationSample.objects.unscoped().exists()


def test_text_a_database_cannot_store_is_stored_replaced(owner):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    body = json.dumps({"attempt": 1, "samples": [sample(0, 0, 0, num_examples=3, answer="a\x00b", error="lone \ud800")]})
    response = engine.client.post(f"{engine.base}/evaluation-samples", body, content_type="application/json")
    assert response.status_code == 200, response.content
    stored = EvaluationSample.objects.get(job=evaluation.job)
    assert (stored.answer, stored.error) == ("a\ufffdb", "lone ?")


def test_duplicates_in_one_batch_keep_the_first(owner):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    first = sample(0, 0, 0, num_examples=3, reward=1.0)
    again = sample(0, 0, 0, num_examples=3, reward=0.0, completion="forged")
    assert engine.evaluation_samples([first, again, again]) == {"accepted": 1, "duplicates": 2}
    assert engine.evaluation_samples([again]) == {"accepted": 0, "duplicates": 1}
    stored = EvaluationSample.objects.get(job=evaluation.job)
    assert (stored.reward, stored.completion) == (1.0, "reply 0")


@pytest.mark.parametrize("ended", [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_no_sample_is_taken_after_the_job_ended(owner, ended):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    engine.running()
    rows = every_sample(evaluation)
    engine.evaluation_samples(rows[:1])
    Job.objects.unscoped().filter(pk=evaluation.job_id).update(status=ended)
    late = engine.client.post(f"{engine.base}/evaluation-samples", {"attempt": 1, "samples": rows[1:]}, format="json")
    assert late.status_code in (401, 403, 409), late.content
    assert EvaluationSample.objects.unscoped().count() == 1


@pytest.mark.parametrize("field, value", [("reward", 1.7e308), ("reward", -1e13), ("functions", {"correct": 1e300})])
def test_a_reward_beyond_what_sums_and_histograms_hold_is_a_400(owner, field, value):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    body = {"attempt": 1, "samples": [{**sample(0, 0, 0, num_examples=3), field: value}]}
    response = engine.client.post(f"{engine.base}/evaluation-samples", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"].startswith(f"samples.0.{field}")
    assert not EvaluationSample.objects.unscoped().exists()


def test_rewards_at_the_bounds_leave_the_evaluation_readable(owner):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    rows = every_sample(evaluation, reward=lambda environment, example, rollout: 1e12 if rollout == 0 else -1e12)
    for row in rows:
        row["functions"] = {"correct": row["reward"], "big": 1e12}
    engine.evaluation_samples(rows)
    job_transition(job=Job.objects.unscoped().get(pk=evaluation.job_id), to=JobStatus.FAILED, error_message="stopped")
    listed = owner.client().get(BASE)
    assert listed.status_code == 200, listed.content
    results = listed.json()["data"][0]["results"]["lab/addition"]
    assert (results["samples"], results["reward_mean"], results["functions"]["big"]) == (6, 0.0, 1e12)
    bins = evaluation_reward_histogram(evaluation=evaluation, environment=0)
    assert [(item["low"], item["count"]) for item in (bins[0], bins[-1])] == [(-1e12, 3), (8e11, 3)]


@pytest.mark.parametrize(
    "name, content",
    [("list.json", b"[1, 2]"), ("text.json", b'"evaluate"'), ("binary.toml", b"\xff\xfe"), ("deep.json", b"[" * 100_000)],
)
def test_lab_evals_run_refuses_a_file_that_is_no_object_as_a_usage_error(tmp_path, capsys, monkeypatch, name, content):
    monkeypatch.setenv("LAB_API_KEY", "lab_unused")
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exited:
        cli_main(["evals", "run", "-f", str(path), "--env", "lab/addition"])
    assert exited.value.code == 2
    assert str(path) in capsys.readouterr().err


# --- evaluations pushed from elsewhere -----------------------------------------------------------

PUSH = {
    "push_id": "vf-0123456789abcdef",
    "model": "gpt-4.1-mini",
    "environment": {"id": "tiny_count", "args": {"num_examples": 5}, "num_examples": 2, "rollouts_per_example": 1},
    "details": {"format": "verifiers-0.3"},
}


@pytest.mark.parametrize(
    "changes, param",
    [
        ({"model": "gpt\x00"}, "model"),
        ({"model": "gpt \ud800"}, "model"),
        ({"name": "run\x00"}, "name"),
        ({"environment": {**PUSH["environment"], "id": "tiny\x00count"}}, "environment.id"),
        ({"environment": {**PUSH["environment"], "args": {"path": "a\x00b"}}}, "environment.args"),
        ({"environment": {**PUSH["environment"], "args": {"\x00": 1}}}, "environment.args"),
        ({"details": {"note": "nul \x00"}}, "details"),
        ({"details": {"lone \udc00": 1}}, "details"),
        ({"metadata": {"team": "a\x00b"}}, "metadata.team"),
        ({"push_id": "vf-0123456789abcdef\n"}, "push_id"),
        ({"push_id": "x" * 129}, "push_id"),
        ({"environment": {**PUSH["environment"], "num_examples": 10**12}}, "environment.num_examples"),
        ({"environment": {**PUSH["environment"], "rollouts_per_example": 10**6}}, "environment.rollouts_per_example"),
        ({"sampling": {"max_tokens": "8"}}, "sampling.max_tokens"),
    ],
)
def test_a_hostile_push_is_a_clean_400_and_creates_nothing(owner, changes, param):
    response = owner.client().post(f"{BASE}/push", json.dumps({**PUSH, **changes}), content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param, response.json()
    assert nothing_created()


def test_pushed_samples_from_a_read_key_another_tenant_or_past_the_bounds_store_nothing(owner, outsider):
    pushed = owner.client().post(f"{BASE}/push", PUSH, format="json").json()
    url = f"{BASE}/{pushed['id']}/samples"
    good = {"example": 0, "rollout": 0, "prompt": [], "completion": "1", "reward": 1.0}
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    assert owner.client(read_key).post(url, {"samples": [good]}, format="json").status_code == 403
    assert owner.client(read_key).post(f"{BASE}/{pushed['id']}/finalize").status_code == 403
    assert outsider.client().post(url, {"samples": [good]}, format="json").status_code == 404
    for bad in ({"reward": 1e300}, {"example": -1}, {"rollout": 10**6}, {"environment": 1}, {"functions": {"x": float("inf")}},
                {"prompt": [{"content": "\x00"}]}, {"info": {"\x00": 1}}):
        response = owner.client().post(url, json.dumps({"samples": [{**good, **bad}]}), content_type="application/json")
        assert response.status_code == 400, (bad, response.content)
    too_many = {"samples": [{**good, "rollout": None, "example": 1}] * 1_001}
    assert owner.client().post(url, too_many, format="json").status_code == 400
    assert not EvaluationSample.objects.unscoped().exists()
    assert owner.client().post(f"{BASE}/{pushed['id']}/finalize").status_code == 409
