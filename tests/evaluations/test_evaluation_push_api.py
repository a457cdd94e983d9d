"""Evaluations that ran elsewhere, pushed through the API (docs/evaluations.md "Results from
elsewhere"): create keyed by ``push_id``, samples stored once by key, finalize with results and
the webhook, the refusals that change nothing, and another organization's evaluation a 404."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation, Source
from jobs.evaluation_samples import EvaluationSample
from jobs.models import Job, JobKind, JobStatus
from jobs.webhooks.models import WebhookEndpoint, WebhookMessage
from lab.audit import Actor
from lab.models import AuditLogEntry
from lab.services import api_key_create
from tests.support.evaluations import create_evaluation
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

BASE = "/api/v1/evaluations"

PUSH = {
    "push_id": "vf-0123456789abcdef",
    "model": "gpt-4.1-mini",
    "environment": {"id": "tiny_count", "args": {"num_examples": 5}, "num_examples": 2, "rollouts_per_example": 2},
    "sampling": {"temperature": 0.7, "max_tokens": 8},
    "details": {"format": "verifiers-0.3", "verifiers_version": "0.3.1"},
}


def sample(example: int, rollout: int | None, reward: float, **fields) -> dict:
    body = {
        "example": example, "prompt": [{"role": "user", "content": f"What comes after {example}?"}],
        "completion": str(example + 1) if reward else "?", "answer": str(example + 1), "reward": reward,
        "functions": {"correct": reward, "num_turns": 1.0}, "prompt_tokens": 7, "completion_tokens": 2, "latency_s": 0.5,
        **fields,
    }
    if rollout is not None:
        body["rollout"] = rollout
    return body


def post(tenant, path: str, body=None, status: int = 200):
    response = tenant.client().post(f"{BASE}{path}", body, format="json")
    assert response.status_code == status, response.content
    return response.json()


def test_a_pushed_run_is_created_receives_its_samples_once_and_ends_with_its_results(owner):
    WebhookEndpoint.objects.create(project=owner.project, url="https://hooks.example.com/lab", events=["evaluation.completed"])
    created = post(owner, "/push", PUSH, status=201)
    evaluation = Evaluation.objects.unscoped().get()
    job = Job.objects.unscoped().get()
    assert (created["id"], created["source"], created["status"], created["results"]) == (
        evaluation.public_id, "pushed", "running", None,
    )
    assert created["model"] == {"type": "endpoint", "id": "gpt-4.1-mini"}
    assert created["environments"] == [{"id": "tiny_count", "args": {"num_examples": 5}, "num_examples": 2, "rollouts_per_example": 2}]
    assert created["details"] == {"format": "verifiers-0.3", "verifiers_version": "0.3.1", "planned": True}
    assert (job.kind, job.status, job.attempt, job.finished_at, job.gpu_seconds) == (JobKind.EVALUATION, JobStatus.SUCCEEDED, 0, None, 0)
    assert_matches(served_document(), "Evaluation", created)

    first = post(owner, f"/{evaluation.public_id}/samples", {"samples": [sample(0, 0, 1.0), sample(0, 1, 0.0), sample(1, 0, 1.0)]})
    again = post(owner, f"/{evaluation.public_id}/samples", {"samples": [sample(0, 0, 0.5), sample(1, 1, 0.0)]})
    assert (first, again) == ({"accepted": 3, "duplicates": 0}, {"accepted": 1, "duplicates": 1})
    assert_matches(served_document(), "EvaluationSamplesPushed", again)

    done = post(owner, f"/{evaluation.public_id}/finalize")
    assert (done["status"], done["finished_at"] is not None) == ("succeeded", True)
    results = done["results"]["tiny_count"]
    assert (results["samples"], results["examples"], results["reward_mean"], results["pass_at_k"]) == (4, 2, 0.5, {"1": 0.5, "2": 1.0})
    assert results["functions"] == {"correct": 0.5, "num_turns": 1.0}
    assert results["tokens"] == {"prompt": 28, "completion": 8}
    assert EvaluationSample.objects.filter(job=job, example=0, rollout=0).get().reward == 1.0  # the first stays
    assert WebhookMessage.objects.filter(type="evaluation.completed").count() == 1
    assert post(owner, f"/{evaluation.public_id}/finalize") == done  # finalizing again changes nothing
    assert WebhookMessage.objects.filter(type="evaluation.completed").count() == 1
    assert sorted(AuditLogEntry.objects.filter(action__startswith="evaluation.").values_list("action", flat=True)) == [
        "evaluation.finalize", "evaluation.push",
    ]
    listed = owner.client().get(f"{BASE}/{evaluation.public_id}/samples?max_reward=0").json()["data"]
    assert [(item["example"], item["rollout"], item["completion"]) for item in listed] == [(0, 1, "?"), (1, 1, "?")]


def test_the_same_push_id_answers_the_same_evaluation_and_stores_nothing_twice(owner):
    first = post(owner, "/push", PUSH, status=201)
    post(owner, f"/{first['id']}/samples", {"samples": [sample(0, 0, 1.0)]})

    second = post(owner, "/push", PUSH, status=200)
    repeated = post(owner, f"/{first['id']}/samples", {"samples": [sample(0, 0, 1.0)]})

    assert second["id"] == first["id"]
    assert repeated == {"accepted": 0, "duplicates": 1}
    assert (Evaluation.objects.unscoped().count(), Job.objects.unscoped().count(), EvaluationSample.objects.unscoped().count()) == (1, 1, 1)


def test_samples_without_a_rollout_take_the_next_free_one_and_an_unplanned_push_takes_what_came(owner):
    body = {**PUSH, "environment": {"id": "tiny_count"}}
    evaluation = post(owner, "/push", body, status=201)

    post(owner, f"/{evaluation['id']}/samples", {"samples": [sample(7, None, 1.0), sample(7, None, 0.0), sample(3, None, 1.0)]})
    post(owner, f"/{evaluation['id']}/samples", {"samples": [sample(7, None, 1.0)]})
    done = post(owner, f"/{evaluation['id']}/finalize")

    keys = sorted(EvaluationSample.objects.unscoped().values_list("example", "rollout"))
    assert keys == [(3, 0), (7, 0), (7, 1), (7, 2)]
    assert done["environments"][0] | {"args": {}} == {"id": "tiny_count", "args": {}, "num_examples": 2, "rollouts_per_example": 3}
    assert done["results"]["tiny_count"]["samples"] == 4


def test_finalize_refuses_a_push_missing_samples_and_samples_after_it_are_refused(owner):
    evaluation = post(owner, "/push", PUSH, status=201)
    assert post(owner, f"/{evaluation['id']}/finalize", status=409)["error"]["message"].endswith("has no sample yet: push its samples, then finalize it.")
    post(owner, f"/{evaluation['id']}/samples", {"samples": [sample(0, 0, 1.0), sample(0, 1, 1.0), sample(1, 0, 1.0)]})

    short = post(owner, f"/{evaluation['id']}/finalize", status=409)
    assert "has 3 of its 4 samples (2 examples x 2 rollouts)" in short["error"]["message"]
    assert Job.objects.unscoped().get().finished_at is None
    post(owner, f"/{evaluation['id']}/samples", {"samples": [sample(1, 1, 0.0)]})
    post(owner, f"/{evaluation['id']}/finalize")
    late = post(owner, f"/{evaluation['id']}/samples", {"samples": [sample(0, 0, 1.0)]}, status=409)
    assert late["error"]["code"] == "invalid_state"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/push", {**PUSH, "push_id": "short"}, "push_id"),
        ("/push", {**PUSH, "model": ""}, "model"),
        ("/push", {**PUSH, "environment": {"id": "x", "num_examples": 0}}, "environment.num_examples"),
        ("/push", {**PUSH, "colour": "blue"}, "colour"),
        ("/push", [1, 2], None),
        ("/push", {**PUSH, "details": {"blob": "x" * 70_000}}, "details"),
        ("samples", {"samples": []}, "samples"),
        ("samples", '{"samples": [{"example": 0, "prompt": [], "completion": "", "reward": NaN}]}', None),
        ("samples", {"samples": [sample(0, 0, "1.0")]}, "samples.0.reward"),
        ("samples", {"samples": [sample(2, 0, 1.0)]}, "samples.0"),
        ("samples", {"samples": [sample(0, 2, 1.0)]}, "samples.0"),
        ("samples", {"samples": [sample(0, 0, 1.0, prompt_tokens=-1)]}, "samples.0.prompt_tokens"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field_and_change_nothing(owner, path, body, param):
    evaluation = post(owner, "/push", {**PUSH, "push_id": "vf-the-good-one"}, status=201)
    url = f"{BASE}/{evaluation['id']}/samples" if path == "samples" else f"{BASE}{path}"

    if isinstance(body, str):
        response = owner.client().post(url, body, content_type="application/json")
    else:
        response = owner.client().post(url, body, format="json")

    assert response.status_code == 400, response.content
    if param is not None:
        assert response.json()["error"]["param"] == param
    assert (Evaluation.objects.unscoped().count(), EvaluationSample.objects.unscoped().count()) == (1, 0)


def test_lab_run_evaluations_take_no_pushed_samples_and_pushed_ones_are_not_retried_or_cancelled(owner):
    own = create_evaluation(owner)
    pushed = post(owner, "/push", PUSH, status=201)

    refused = [
        owner.client().post(f"{BASE}/{own.public_id}/samples", {"samples": [sample(0, 0, 1.0)]}, format="json"),
        owner.client().post(f"{BASE}/{own.public_id}/finalize"),
        owner.client().post(f"{BASE}/{pushed['id']}/retry"),
        owner.client().post(f"{BASE}/{pushed['id']}/cancel"),
    ]

    assert [response.status_code for response in refused] == [400, 400, 400, 400]
    assert "is run by Lab" in refused[0].json()["error"]["message"]
    assert "ran elsewhere and was pushed to Lab: there is nothing to retry" in refused[2].json()["error"]["message"]
    assert Evaluation.objects.unscoped().get(public_id=pushed["id"]).source == Source.PUSHED
    assert EvaluationSample.objects.unscoped().count() == 0


def test_another_organizations_pushed_evaluation_is_a_404_and_its_push_id_is_its_own(owner, outsider):
    theirs = post(outsider, "/push", PUSH, status=201)

    answers = [
        owner.client().post(f"{BASE}/{theirs['id']}/samples", {"samples": [sample(0, 0, 1.0)]}, format="json"),
        owner.client().post(f"{BASE}/{theirs['id']}/finalize"),
        owner.client().get(f"{BASE}/{theirs['id']}"),
        owner.client().delete(f"{BASE}/{theirs['id']}"),
    ]
    mine = post(owner, "/push", PUSH, status=201)  # the same push_id in another organization is another push

    assert [response.status_code for response in answers] == [404, 404, 404, 404]
    assert mine["id"] != theirs["id"]
    assert EvaluationSample.objects.unscoped().count() == 0


def test_a_read_key_cannot_push(owner):
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])

    response = owner.client(key).post(f"{BASE}/push", PUSH, format="json")

    assert response.status_code == 403
    assert not Evaluation.objects.unscoped().exists()


def test_a_finalized_push_is_deleted_with_its_samples(owner):
    evaluation = post(owner, "/push", {**PUSH, "environment": {"id": "tiny_count"}}, status=201)
    post(owner, f"/{evaluation['id']}/samples", {"samples": [sample(0, None, 1.0)]})
    post(owner, f"/{evaluation['id']}/finalize")

    assert owner.client().delete(f"{BASE}/{evaluation['id']}").status_code == 204
    assert (Evaluation.objects.unscoped().count(), Job.objects.unscoped().count(), EvaluationSample.objects.unscoped().count()) == (0, 0, 0)
