"""The evaluation REST API (docs/evaluations.md): create (the evaluation job it queues, the body's
checks in its own terms), list, get, samples with their filters and cursor, cancel, retry, delete,
and another organization's evaluation answering 404 everywhere."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation
from jobs.evaluation_samples import EvaluationSample
from jobs.models import Job, JobKind, JobStatus
from jobs.services import job_transition
from lab.audit import Actor
from lab.models import AuditLogEntry
from lab.services import api_key_create
from tests.support.evaluations import EvaluationEngine, create_evaluation, evaluation_body, every_sample
from tests.support.jobs_helpers import Engine, ready_checkpoint, submit
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

BASE = "/api/v1/evaluations"


def post(tenant, body: dict, status: int = 201) -> dict:
    response = tenant.client().post(BASE, body, format="json")
    assert response.status_code == status, response.content
    return response.json()


def test_it_creates_an_evaluation_queued_as_an_evaluation_job(owner):
    body = post(owner, evaluation_body())
    evaluation = Evaluation.objects.unscoped().get()
    job = Job.objects.unscoped().get()
    assert body == {
        "id": evaluation.public_id,
        "object": "evaluation",
        "name": "tiny-baseline",
        "source": "lab",
        "status": "queued",
        "status_reason": "waiting",
        "job_id": job.public_id,
        "model": {"type": "model", "id": "lab/tiny-random-llama"},
        "base_model": "lab/tiny-random-llama",
        "environments": [
            {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2},
            {"id": "lab/reverse-text", "args": {}, "num_examples": 2, "rollouts_per_example": 1},
        ],
        "sampling": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 8, "seed": 3},
        "progress": {"samples": 0, "expected_samples": 8},
        "results": None,
        "error": None,
        "usage": {"gpu_seconds": 0.0, "cpu_seconds": 0.0, "cost_usd": "0.00", "prompt_tokens": 0, "completion_tokens": 0},
        "metadata": {},
        "details": {},
        "created_at": body["created_at"],
        "started_at": None,
        "finished_at": None,
    }
    assert job.kind == JobKind.EVALUATION
    assert job.model == "lab/tiny-random-llama"
    assert job.spec["seed"] == 3
    assert job.spec["eval"]["env"] == [
        {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 3, "rollouts_per_example": 2},
        {"id": "lab/reverse-text", "args": {}, "num_examples": 2, "rollouts_per_example": 1},
    ]
    assert job.spec["eval"]["sampling"] == {"max_tokens": 8, "temperature": 0.7, "extra_body": {"top_p": 0.9}}
    assert job.spec["metadata"] == {"evaluation": evaluation.public_id}
    actions = set(AuditLogEntry.objects.values_list("action", flat=True))
    assert {"evaluation.create", "job.create"} <= actions
    assert_matches(served_document(), "Evaluation", body)


def test_all_examples_is_the_whole_eval_split(owner):
    body = evaluation_body(environments=[{"id": "lab/addition", "num_examples": "all", "rollouts_per_example": 4}])
    created = post(owner, body)
    assert created["environments"][0]["num_examples"] == "all"
    assert created["progress"] == {"samples": 0, "expected_samples": None}
    assert Job.objects.unscoped().get().spec["eval"]["env"][0]["num_examples"] == -1
    minus_one = post(owner, evaluation_body(environments=[{"id": "lab/addition", "num_examples": -1}]))
    assert minus_one["environments"][0]["num_examples"] == "all"


@pytest.mark.parametrize(
    "changes, param, code",
    [
        ({"environments": [{"id": "lab/nope"}]}, "environments.0.id", "unknown_environment"),
        ({"environments": [{"id": "lab/addition", "args": {"max_operandd": 3}}]}, "environments.0.args.max_operandd", "unknown_key"),
        ({"environments": [{"id": "lab/addition", "args": {"max_operand": "9"}}]}, "environments.0.args.max_operand", "invalid_type"),
        ({"environments": [{"id": "lab/addition", "num_examples": 0}]}, "environments.0.num_examples", "value_error"),
        ({"environments": [{"id": "lab/addition", "rollouts_per_example": 257}]}, "environments.0.rollouts_per_example", "less_than_equal"),
        ({"environments": []}, "environments", "too_short"),
        ({"environments": [{"id": "lab/addition"}, {"id": "lab/addition"}]}, "environments.1.id", "duplicate"),
        ({"model": {"type": "model", "id": "nobody/nothing"}}, "model.id", "unknown_model"),
        ({"model": {"type": "checkpoint"}}, "model.id", "missing"),
        ({"model": {"type": "endpoint", "base_url": "https://example.com/v1"}}, "model.model", "missing"),
        ({"sampling": {"temperature": 3}}, "sampling.temperature", "less_than_equal"),
        ({"sampling": {"top_p": 0}}, "sampling.top_p", "greater_than"),
        ({"sampling": {"max_tokens": 100_000}}, "sampling.max_tokens", "out_of_range"),
        ({"samplin": {}}, "samplin", "extra_forbidden"),
    ],
)
def test_it_refuses_a_bad_body_at_submit_naming_the_field(owner, changes, param, code):
    answer = post(owner, evaluation_body(**changes), status=400)
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["code"] == "invalid_request"
    assert answer["error"]["param"] == param
    assert (answer["error"]["errors"][0]["param"], answer["error"]["errors"][0]["code"]) == (param, code)
    assert not Evaluation.objects.unscoped().exists()
    assert not Job.objects.unscoped().exists()


def test_a_checkpoint_is_evaluated_from_its_base_model_with_its_lora_rank(owner, spec):
    trained = submit(owner, spec, lora_rank=8, lora_alpha=16)
    checkpoint_id, _ = ready_checkpoint(Engine(trained))
    body = post(owner, evaluation_body(model={"type": "checkpoint", "id": checkpoint_id}))
    assert (body["model"], body["base_model"]) == ({"type": "checkpoint", "id": checkpoint_id}, "lab/tiny-random-llama")
    job = Job.objects.unscoped().get(public_id=body["job_id"])
    assert (job.spec["init_from"], job.spec["lora_rank"], job.spec["lora_alpha"]) == (checkpoint_id, 8, 16)
    assert job.init_from.public_id == checkpoint_id


def test_another_organizations_checkpoint_is_as_missing_as_an_unknown_one(owner, outsider, spec):
    checkpoint_id, _ = ready_checkpoint(Engine(submit(outsider, spec)))
    foreign = post(owner, evaluation_body(model={"type": "checkpoint", "id": checkpoint_id}), status=404)
    missing = post(owner, evaluation_body(model={"type": "checkpoint", "id": "ckpt_doesnotexist"}), status=404)
    assert foreign["error"]["code"] == missing["error"]["code"] == "not_found"
    assert foreign["error"]["message"] == missing["error"]["message"]
    assert not Evaluation.objects.unscoped().exists()


def test_it_lists_and_gets_the_projects_evaluations_newest_first(owner, outsider):
    first, second = create_evaluation(owner), create_evaluation(owner)
    create_evaluation(outsider)
    listed = owner.client().get(BASE).json()
    assert [item["id"] for item in listed["data"]] == [second.public_id, first.public_id]
    assert listed["has_more"] is False
    page = owner.client().get(BASE, {"limit": 1}).json()
    assert ([item["id"] for item in page["data"]], page["has_more"]) == ([second.public_id], True)
    assert owner.client().get(BASE, {"status": "running"}).json()["data"] == []
    assert owner.client().get(BASE, {"status": "sideways"}).status_code == 400
    got = owner.client().get(f"{BASE}/{first.public_id}").json()
    assert got == listed["data"][1]
    assert_matches(served_document(), "EvaluationList", listed)


def test_samples_are_listed_in_order_filtered_by_environment_and_reward(owner):
    evaluation = create_evaluation(owner)
    engine = EvaluationEngine(evaluation.job)
    engine.evaluation_samples(every_sample(evaluation, reward=lambda environment, example, rollout: example / 2))
    url = f"{BASE}/{evaluation.public_id}/samples"
    everything = owner.client().get(url, {"limit": 100}).json()
    assert [(s["environment"], s["example"], s["rollout"]) for s in everything["data"]] == [
        ("lab/addition", 0, 0), ("lab/addition", 0, 1), ("lab/addition", 1, 0), ("lab/addition", 1, 1),
        ("lab/addition", 2, 0), ("lab/addition", 2, 1), ("lab/reverse-text", 0, 0), ("lab/reverse-text", 1, 0),
    ]
    first = everything["data"][0]
    assert first == {
        "id": first["id"], "object": "evaluation_sample", "environment": "lab/addition", "example": 0, "rollout": 0,
        "prompt": [{"role": "user", "content": "example 0"}], "completion": "reply 0", "answer": "42", "reward": 0.0,
        "functions": {"correct": 0.0}, "info": {}, "tokens": {"prompt": 5, "completion": 3}, "latency_s": 0.25,
        "truncated": False, "timed_out": False, "error": None, "attempt": 1, "created_at": first["created_at"],
    }
    assert_matches(served_document(), "EvaluationSampleList", everything)
    rewarded = owner.client().get(url, {"environment": "lab/addition", "min_reward": "0.5", "max_reward": "0.5"}).json()
    assert [(s["example"], s["rollout"]) for s in rewarded["data"]] == [(1, 0), (1, 1)]
    page = owner.client().get(url, {"limit": 3}).json()
    after = owner.client().get(url, {"limit": 3, "after": page["data"][-1]["id"]}).json()
    assert [s["id"] for s in page["data"] + after["data"]] == [s["id"] for s in everything["data"][:6]]
    assert owner.client().get(url, {"environment": "lab/nope"}).status_code == 400
    assert owner.client().get(url, {"min_reward": "lots"}).status_code == 400
    assert owner.client().get(url, {"after": "evs_unknown"}).status_code == 404


def test_cancel_retry_and_delete(owner):
    evaluation = create_evaluation(owner)
    client, url = owner.client(), f"{BASE}/{evaluation.public_id}"
    assert client.delete(url).status_code == 409  # still queued
    cancelled = client.post(f"{url}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert client.post(f"{url}/cancel").status_code == 409
    retried = client.post(f"{url}/retry").json()
    assert (retried["status"], retried["status_reason"]) == ("queued", "waiting")
    assert client.post(f"{url}/retry").status_code == 409
    client.post(f"{url}/cancel")
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404
    assert not Job.objects.unscoped().filter(pk=evaluation.job_id).exists()
    actions = list(AuditLogEntry.objects.filter(action__startswith="evaluation.").values_list("action", flat=True))
    assert sorted(actions) == sorted(
        ["evaluation.create", "evaluation.cancel", "evaluation.retry", "evaluation.cancel", "evaluation.delete"]
    )


@pytest.mark.parametrize(
    "method, suffix",
    [("get", ""), ("get", "/samples"), ("post", "/cancel"), ("post", "/retry"), ("delete", "")],
)
def test_another_organizations_evaluation_is_not_found_and_unchanged(owner, outsider, method, suffix):
    theirs = create_evaluation(outsider)
    EvaluationEngine(theirs.job).evaluation_samples(every_sample(theirs)[:2])
    job_transition(job=Job.objects.unscoped().get(pk=theirs.job_id), to=JobStatus.FAILED, error_message="stopped")
    foreign = getattr(owner.client(), method)(f"{BASE}/{theirs.public_id}{suffix}")
    missing = getattr(owner.client(), method)(f"{BASE}/eval_doesnotexist{suffix}")
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["error"]["message"] == missing.json()["error"]["message"]
    job = Job.objects.unscoped().get(pk=theirs.job_id)
    assert job.status == JobStatus.FAILED
    assert EvaluationSample.objects.unscoped().filter(job=job).count() == 2
    assert owner.client().get(BASE).json()["data"] == []


def test_a_read_key_lists_but_cannot_create(owner):
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    assert owner.client(key).get(BASE).status_code == 200
    assert owner.client(key).post(BASE, evaluation_body(), format="json").status_code == 403
    assert not Evaluation.objects.unscoped().exists()
