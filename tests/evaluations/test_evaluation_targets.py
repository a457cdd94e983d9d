"""What ``POST /evaluations`` evaluates besides a model or a checkpoint: a ready adapter of the
project, an OpenAI-compatible endpoint (its API key a job secret of the evaluation) and a
deployment of the project (Lab's OpenAI-compatible API); another tenant's adapter or deployment
is the same 404 as a missing one; the job spec each makes, and the engine's access to the
adapter it evaluates (docs/evaluations.md)."""

from __future__ import annotations

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from evaluations.models import Evaluation
from jobs.artifacts.kinds import ADAPTER
from jobs.ingest.tokens import job_token
from jobs.models import Adapter, AdapterStatus, Job, JobKind
from jobs.secrets.services import engine_secrets
from jobs.services import job_claim_for_start
from lab.audit import Actor
from serving.models import Deployment, DeploymentStatus
from serving.services import deployment_create, deployment_transition
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.evaluations import evaluation_body
from tests.support.jobs_helpers import submit
from tests.support.serving import TINY, adapter_archive, ready_adapter, ready_artifact

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "artifact_storage")]

BASE = "/api/v1/evaluations"
ENDPOINT = {"type": "endpoint", "base_url": "https://models.example.com/v1", "model": "acme/chat-7b", "api_key_secret": "ACME_KEY"}


def post(tenant, body: dict, status: int = 201) -> dict:
    response = tenant.client().post(BASE, body, format="json")
    assert response.status_code == status, response.content
    return response.json()


def nothing_created() -> bool:
    return not Evaluation.objects.unscoped().exists() and not Job.objects.unscoped().filter(kind=JobKind.EVALUATION).exists()


def deployment_of(tenant) -> str:
    deployment = deployment_create(project=tenant.project, actor=Actor(user=tenant.user), data={"source": {"type": "model", "id": TINY}})
    return deployment.public_id


def test_it_evaluates_a_ready_adapter_on_its_base_model_with_its_lora_rank(owner):
    adapter_id = ready_adapter(owner)
    body = post(owner, evaluation_body(model={"type": "adapter", "id": adapter_id}))
    assert (body["model"], body["base_model"]) == ({"type": "adapter", "id": adapter_id}, TINY)
    job = Job.objects.unscoped().get(public_id=body["job_id"])
    assert (job.kind, job.spec["eval"]["adapter"], job.spec["lora_rank"], job.spec["lora_alpha"]) == (JobKind.EVALUATION, adapter_id, 4, 8)
    assert job.spec.get("init_from") is None and job.init_from is None


def test_the_evaluation_job_downloads_its_adapter_and_no_other(owner):
    adapter_id, other_id = ready_adapter(owner), ready_adapter(owner, fill=-0.5)
    job = Job.objects.unscoped().get(public_id=post(owner, evaluation_body(model={"type": "adapter", "id": adapter_id}))["job_id"])
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(job_claim_for_start(job_id=job.pk))}")
    base = f"/api/v1/ingest/jobs/{job.public_id}/adapters"
    downloaded = engine.get(f"{base}/{adapter_id}/download")
    assert downloaded.status_code == 200
    assert b"".join(downloaded.streaming_content) == adapter_archive(0.5)
    refused = engine.get(f"{base}/{other_id}/download")
    assert (refused.status_code, refused.json()["error"]["code"]) == (404, "not_found")


def test_a_training_jobs_engine_cannot_download_an_adapter(owner, spec):
    adapter_id = ready_adapter(owner)
    job = submit(owner, spec)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(job_claim_for_start(job_id=job.pk))}")
    refused = engine.get(f"/api/v1/ingest/jobs/{job.public_id}/adapters/{adapter_id}/download")
    assert refused.status_code == 404


def test_another_organizations_adapter_is_as_missing_as_an_unknown_one(owner, outsider):
    foreign_id = ready_adapter(outsider)
    foreign = post(owner, evaluation_body(model={"type": "adapter", "id": foreign_id}), status=404)
    missing = post(owner, evaluation_body(model={"type": "adapter", "id": "adp_doesnotexist"}), status=404)
    assert foreign["error"] == missing["error"] == {**foreign["error"], "code": "not_found", "message": "No such adapter."}
    assert nothing_created()


def test_an_adapter_that_is_not_ready_is_refused(owner):
    adapter_id = ready_artifact(owner, ADAPTER, adapter_archive(0.5))
    Adapter.objects.unscoped().filter(public_id=adapter_id).update(status=AdapterStatus.DELETED)
    refused = post(owner, evaluation_body(model={"type": "adapter", "id": adapter_id}), status=409)
    assert (refused["error"]["code"], refused["error"]["param"]) == ("adapter_not_ready", "model.id")
    assert nothing_created()


def test_it_evaluates_an_endpoint_with_its_key_a_job_secret_never_shown(owner):
    body = post(owner, evaluation_body(model=ENDPOINT, secrets={"ACME_KEY": "sk-acme-1234"}))
    assert (body["model"], body["details"]) == (
        {"type": "endpoint", "id": "acme/chat-7b"},
        {"endpoint": {"base_url": "https://models.example.com/v1", "api_key_secret": "ACME_KEY"}},
    )
    assert "sk-acme-1234" not in str(body)
    job = Job.objects.unscoped().get(public_id=body["job_id"])
    assert job.spec["eval"]["endpoint"] == {"base_url": "https://models.example.com/v1", "model": "acme/chat-7b", "api_key_var": "ACME_KEY"}
    assert "secrets" not in job.spec and "sk-acme-1234" not in str(job.spec)
    assert engine_secrets(job_id=job.public_id) == {"ACME_KEY": "sk-acme-1234"}


@pytest.mark.parametrize(
    "target, secrets, param, code",
    [
        (ENDPOINT, {}, "model.api_key_secret", "missing_secret"),
        (ENDPOINT, {"OTHER_KEY": "x"}, "model.api_key_secret", "missing_secret"),
        (ENDPOINT, {"ACME_KEY": "k", "LAB_API_KEY": "x"}, "secrets.LAB_API_KEY", "invalid_value"),
        (ENDPOINT, {"ACME_KEY": "line\nbreak"}, "model.api_key_secret", "invalid_secret"),
        ({**ENDPOINT, "base_url": "ftp://models.example.com/v1"}, {"ACME_KEY": "k"}, "model.base_url", "invalid_value"),
        ({**ENDPOINT, "base_url": "https:///v1"}, {"ACME_KEY": "k"}, "model.base_url", "invalid_value"),
        ({key: value for key, value in ENDPOINT.items() if key != "model"}, {"ACME_KEY": "k"}, "model.model", "missing"),
        ({**ENDPOINT, "id": "x"}, {"ACME_KEY": "k"}, "model.id", "unexpected"),
        ({"type": "adapter"}, {}, "model.id", "missing"),
        ({"type": "adapter", "id": "adp_x", "base_url": "https://h/v1"}, {}, "model.base_url", "unexpected"),
        ({"type": "deployment", "id": "dep_x", "model": "m"}, {}, "model.model", "unexpected"),
    ],
)
def test_it_refuses_a_bad_target_at_submit_naming_the_field(owner, target, secrets, param, code):
    answer = post(owner, evaluation_body(model=target, secrets=secrets), status=400)
    assert (answer["error"]["code"], answer["error"]["param"]) == ("invalid_request", param)
    assert (answer["error"]["errors"][0]["param"], answer["error"]["errors"][0]["code"]) == (param, code)
    assert nothing_created()


def test_it_evaluates_a_deployment_of_the_project_through_labs_openai_api(owner):
    deployment_id = deployment_of(owner)
    body = post(owner, evaluation_body(
        model={"type": "deployment", "id": deployment_id, "api_key_secret": "DEPLOYMENT_KEY"}, secrets={"DEPLOYMENT_KEY": owner.key},
    ))
    assert (body["model"], body["base_model"]) == ({"type": "deployment", "id": deployment_id}, TINY)
    job = Job.objects.unscoped().get(public_id=body["job_id"])
    assert job.spec["eval"]["endpoint"] == {
        "base_url": f"{settings.LAB_PUBLIC_URL}/api/v1/openai/v1", "model": TINY, "api_key_var": "DEPLOYMENT_KEY",
    }


def test_another_organizations_deployment_is_as_missing_as_an_unknown_one(owner, outsider):
    foreign_id = deployment_of(outsider)
    target = {"type": "deployment", "api_key_secret": "DEPLOYMENT_KEY"}
    secrets = {"DEPLOYMENT_KEY": owner.key}
    foreign = post(owner, evaluation_body(model={**target, "id": foreign_id}, secrets=secrets), status=404)
    missing = post(owner, evaluation_body(model={**target, "id": "dep_doesnotexist"}, secrets=secrets), status=404)
    assert foreign["error"] == missing["error"] == {**foreign["error"], "code": "not_found", "message": "No such deployment."}
    assert nothing_created()


def test_a_stopped_deployment_is_refused(owner):
    deployment_id = deployment_of(owner)
    deployment = Deployment.objects.unscoped().get(public_id=deployment_id)
    deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason="test")
    refused = post(owner, evaluation_body(
        model={"type": "deployment", "id": deployment_id, "api_key_secret": "K"}, secrets={"K": owner.key},
    ), status=409)
    assert (refused["error"]["code"], refused["error"]["param"]) == ("invalid_state", "model.id")
    assert nothing_created()


def test_a_training_job_cannot_name_an_evaluations_adapter_or_endpoint(owner, spec):
    endpoint = {"base_url": "https://models.example.com/v1", "model": "m", "api_key_var": "K"}
    response = owner.client().post("/api/v1/jobs", {**spec, "eval": {"endpoint": endpoint}, "secrets": {"K": "v"}}, format="json")
    assert response.status_code == 400
    assert [(e["param"], e["code"]) for e in response.json()["error"]["errors"]] == [("eval.endpoint", "evaluation_only")]
    assert not Job.objects.unscoped().exists()


@pytest.mark.parametrize(
    "base_url, code",
    [
        ("http://127.0.0.1:9000/v1", "private_address"),
        ("http://localhost:9000/v1", "private_address"),  # a name: judged by what it resolves to
        ("http://[::1]:9000/v1", "private_address"),
        ("http://10.2.3.4/v1", "private_address"),
        ("http://192.168.1.20:8080/v1", "private_address"),
        ("http://169.254.169.254/latest", "blocked_address"),
        ("http://[::ffff:169.254.169.254]/latest", "blocked_address"),
    ],
)
def test_it_refuses_an_endpoint_on_an_address_the_pools_engines_may_not_reach(owner, base_url, code):
    answer = post(owner, evaluation_body(model={**ENDPOINT, "base_url": base_url}, secrets={"ACME_KEY": "k"}), status=400)
    assert (answer["error"]["code"], answer["error"]["param"]) == ("invalid_request", "model.base_url")
    assert [(error["param"], error["code"]) for error in answer["error"]["errors"]] == [("model.base_url", code)]
    configuration = "LAB_ENGINE_EGRESS_ALLOW_PRIVATE=1" if code == "private_address" else "whatever the configuration"
    assert configuration in answer["error"]["errors"][0]["message"]
    assert nothing_created()


def test_a_pool_allowing_private_egress_takes_a_private_endpoint_but_never_a_metadata_address(owner, settings):
    settings.LAB_ENGINE_EGRESS_ALLOW_PRIVATE = True
    local = post(owner, evaluation_body(model={**ENDPOINT, "base_url": "http://127.0.0.1:9000/v1"}, secrets={"ACME_KEY": "k"}))
    assert local["details"]["endpoint"]["base_url"] == "http://127.0.0.1:9000/v1"
    metadata = post(owner, evaluation_body(model={**ENDPOINT, "base_url": "http://169.254.169.254/v1"}, secrets={"ACME_KEY": "k"}), status=400)
    assert metadata["error"]["errors"][0]["code"] == "blocked_address"


def test_labs_own_origin_is_an_endpoint_the_engines_reach(owner, settings):
    settings.LAB_PUBLIC_URL = "http://127.0.0.1:8123"
    own = post(owner, evaluation_body(model={**ENDPOINT, "base_url": "http://127.0.0.1:8123/api/v1/openai/v1"}, secrets={"ACME_KEY": "k"}))
    assert own["model"] == {"type": "endpoint", "id": "acme/chat-7b"}
    other_port = post(owner, evaluation_body(model={**ENDPOINT, "base_url": "http://127.0.0.1:8124/v1"}, secrets={"ACME_KEY": "k"}), status=400)
    assert other_port["error"]["errors"][0]["code"] == "private_address"


def test_a_training_jobs_eval_endpoint_is_refused_as_an_evaluations_is(owner, spec):
    spec["eval"] = {**spec.get("eval", {}), "endpoint": {"base_url": "http://10.0.0.7/v1", "model": "m", "api_key_var": "K"}}
    response = owner.client().post("/api/v1/jobs", {**spec, "secrets": {"K": "k"}}, format="json")
    assert response.status_code == 400, response.content
    assert [(error["param"], error["code"]) for error in response.json()["error"]["errors"]] == [("eval.endpoint.base_url", "private_address")]
    assert not Job.objects.unscoped().exists()


def test_a_teacher_or_judge_on_an_address_the_engines_may_not_reach_is_refused_at_submit(owner, spec, settings):
    teacher = {"model": "big/teacher", "client": {"base_url": "http://169.254.169.254/v1", "api_key_var": "K"}}
    judged = {**spec["env"][0], "judge": {"base_url": "http://10.0.0.7/v1"}}
    body = {**spec, "loss": "sft", "teacher": teacher, "env": [judged], "secrets": {"K": "k"}}
    response = owner.client().post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400, response.content
    problems = {(error["param"], error["code"]) for error in response.json()["error"]["errors"]}
    assert {("teacher.client.base_url", "blocked_address"), ("env.0.judge.base_url", "private_address")} <= problems
    settings.LAB_ENGINE_EGRESS_ALLOW_PRIVATE = True
    response = owner.client().post("/api/v1/jobs", body, format="json")
    problems = {(error["param"], error["code"]) for error in response.json()["error"]["errors"]}
    assert ("teacher.client.base_url", "blocked_address") in problems
    assert not any(param == "env.0.judge.base_url" for param, _ in problems)
    assert not Job.objects.unscoped().exists()
