"""The OpenAPI document at /api/v1/schema (lab.api.schema): OpenAPI 3.1, bodies as components,
errors, links, and real answers that match the components they are documented with
(``tests/support/schema_check.py`` checks them closed: no field the component does not list).
"""

from __future__ import annotations

import copy
import json
import re

import pytest
from django.utils import timezone
from drf_spectacular.validation import validate_schema
from jsonschema import Draft202012Validator
from labsdk.spec import job_spec_json_schema
from rest_framework.test import APIClient

from jobs.models import Checkpoint, CheckpointStatus, Job, JobStatus, LogLine, MetricStep, RolloutSample
from jobs.services import job_transition
from tests.support.schema_check import assert_matches, served_document

pytestmark = pytest.mark.django_db


@pytest.fixture
def document() -> dict:
    return served_document()


def _operations(document: dict):
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            yield path, method, operation


def _response_schema(document: dict, path: str, method: str, status: str) -> dict:
    return document["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


# --- the document -----------------------------------------------------------------------------


def test_it_is_a_valid_openapi_3_1_document_of_valid_json_schemas(document):
    assert document["openapi"] == "3.1.0"
    validate_schema(document)
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


def test_every_json_body_is_a_component_not_a_free_form_object(document):
    free_form = []
    for path, method, operation in _operations(document):
        bodies = [("request", operation.get("requestBody", {}).get("content", {}).get("application/json"))]
        bodies += [
            (status, answer.get("content", {}).get("application/json"))
            for status, answer in operation["responses"].items()
        ]
        for where, body in bodies:
            if body is not None and "$ref" not in body["schema"] and path != "/api/v1/schema/job-spec.json":
                free_form.append(f"{method.upper()} {path} {where}")
    assert free_form == []


def test_the_job_spec_component_is_labsdks_json_schema(document):
    served = job_spec_json_schema()
    components = document["components"]["schemas"]
    text = json.dumps(components["JobSpec"]).replace('"#/components/schemas/', '"#/$defs/')
    assert json.loads(text) == {key: value for key, value in served.items() if key not in ("$defs", "$schema", "title")}
    for name, definition in served["$defs"].items():
        assert json.loads(json.dumps(components[name]).replace('"#/components/schemas/', '"#/$defs/')) == definition
    for path in ("/api/v1/jobs", "/api/v1/jobs/estimate"):
        body = document["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/JobCreate"}
    create = components["JobCreate"]
    secrets = create["properties"].pop("secrets")
    assert create == components["JobSpec"]  # the spec's keys, and the secrets beside them
    assert secrets["writeOnly"] is True and secrets["additionalProperties"] == {"type": "string"}


def test_every_authenticated_operation_documents_the_error_body(document):
    error = {"$ref": "#/components/schemas/Error"}
    for path, method, operation in _operations(document):
        if not operation.get("security"):
            continue
        for status in ("401", "403", "429"):
            assert _response_schema(document, path, method, status) == error, (method, path, status)
        if "{" in path:
            assert _response_schema(document, path, method, "404") == error, (method, path)
    assert "409" in document["paths"]["/api/v1/checkpoints/{checkpoint_id}/download"]["get"]["responses"]
    assert "400" in document["paths"]["/api/v1/jobs"]["post"]["responses"]


def test_every_authenticated_post_takes_an_idempotency_key(document):
    for path, method, operation in _operations(document):
        if method == "post" and operation.get("security"):
            names = [parameter["name"] for parameter in operation["parameters"] if parameter["in"] == "header"]
            assert names == ["Idempotency-Key"], path


def test_query_parameters_may_be_empty_and_no_string_parameter_takes_a_nul(document):
    for path, method, operation in _operations(document):
        for parameter in operation.get("parameters", []):
            schema = parameter["schema"]
            if parameter["in"] == "query":
                assert parameter["allowEmptyValue"] is True, (method, path, parameter["name"])
            if parameter["in"] in ("query", "path") and schema["type"] == "string" and "enum" not in schema:
                # the NUL pattern, or a narrower one of the parameter's own (GET /usage's dates)
                assert re.search(schema["pattern"], "\x00") is None, (method, path, parameter["name"])
                assert re.search(schema["pattern"], "2026-11-01\x00") is None, (method, path, parameter["name"])


def test_create_answers_link_to_the_operations_on_the_new_object(document):
    job_links = document["paths"]["/api/v1/jobs"]["post"]["responses"]["201"]["links"]
    assert job_links["jobs_retrieve"] == {
        "operationId": "jobs_retrieve",
        "parameters": {"job_id": "$response.body#/id"},
    }
    assert set(job_links) == {
        "jobs_retrieve",
        "jobs_destroy",
        "jobs_cancel_create",
        "jobs_restart_create",
        "jobs_events_list",
        "jobs_metrics_list",
        "jobs_samples_list",
        "jobs_distributions_retrieve",
        "jobs_logs_list",
        "jobs_checkpoints_list",
        "jobs_adapters_list",
    }
    endpoint_links = document["paths"]["/api/v1/webhook-endpoints"]["post"]["responses"]["201"]["links"]
    assert endpoint_links["webhook_endpoints_retrieve"] == {
        "operationId": "webhook_endpoints_retrieve",
        "parameters": {"endpoint_id": "$response.body#/id"},
    }
    assert set(endpoint_links) == {
        "webhook_endpoints_retrieve",
        "webhook_endpoints_partial_update",
        "webhook_endpoints_destroy",
        "webhook_endpoints_rotate_secret_create",
        "webhook_endpoints_test_create",
        "webhook_endpoints_deliveries_list",
    }
    operation_ids = {operation["operationId"] for _, _, operation in _operations(document)}
    assert set(job_links) | set(endpoint_links) <= operation_ids


def test_job_answers_match_their_components(document, owner, spec):
    client = owner.client()
    created = client.post("/api/v1/jobs", spec | {"wandb": {"project": "x"}}, format="json")
    assert created.status_code == 201
    assert_matches(document, "Job", created.json())
    job = Job.objects.unscoped().get(public_id=created.json()["id"])
    Checkpoint.objects.create(job=job, step=2, attempt=1, format="peft-lora", status=CheckpointStatus.READY)
    Checkpoint.objects.create(job=job, step=3, attempt=1, format="peft-lora")
    job_transition(job=job, to=JobStatus.STARTING)
    job_transition(job=job, to=JobStatus.RUNNING)
    job_transition(job=job, to=JobStatus.FAILED, error_code="oom", error_message="Out of memory.")

    failed = client.get(f"/api/v1/jobs/{job.public_id}").json()
    assert failed["error"]["code"] == "oom" and failed["latest_checkpoint"]["step"] == 2
    assert_matches(document, "Job", failed)
    assert_matches(document, "JobList", client.get("/api/v1/jobs").json())
    assert_matches(document, "CheckpointList", client.get(f"/api/v1/jobs/{job.public_id}/checkpoints").json())
    assert_matches(document, "JobEventList", client.get(f"/api/v1/jobs/{job.public_id}/events").json())
    assert_matches(document, "Job", client.post(f"/api/v1/jobs/{job.public_id}/restart").json())
    assert_matches(document, "Estimate", client.post("/api/v1/jobs/estimate", spec, format="json").json())


def test_job_data_answers_match_their_components(document, owner, spec):
    client = owner.client()
    job = Job.objects.unscoped().get(public_id=client.post("/api/v1/jobs", spec, format="json").json()["id"])
    now = timezone.now()
    MetricStep.objects.create(job=job, step=1, attempt=1, time=now, values={"reward/mean": 0.5, "loss/mean": 1.25})
    RolloutSample.objects.create(
        job=job,
        step=1,
        attempt=1,
        group=0,
        prompt="1+1=",
        completion="2",
        reward=1.0,
        advantage=0.5,
        metrics={"exact": 1.0},
    )
    LogLine.objects.create(job=job, attempt=1, source="engine", source_seq=1, time=now, stream="stdout", line="step 1")

    metrics = client.get(f"/api/v1/jobs/{job.public_id}/metrics").json()
    samples = client.get(f"/api/v1/jobs/{job.public_id}/samples").json()
    logs = client.get(f"/api/v1/jobs/{job.public_id}/logs").json()

    assert [len(answer["data"]) for answer in (metrics, samples, logs)] == [1, 1, 1]
    assert_matches(document, "MetricPointList", metrics)
    assert_matches(document, "RolloutSampleList", samples)
    assert_matches(document, "LogLineList", logs)


def test_account_and_catalogue_answers_match_their_components(document, owner, default_prices):
    client = owner.client()
    assert_matches(document, "WhoAmI", client.get("/api/v1/whoami").json())
    for path, component in (("models", "ModelList"), ("environments", "EnvironmentList"), ("prices", "PriceList")):
        answer = client.get(f"/api/v1/{path}").json()
        assert answer["data"], path
        assert_matches(document, component, answer)


@pytest.mark.parametrize(
    ("method", "url", "path", "body", "status"),
    [
        ("post", "/api/v1/jobs", "/api/v1/jobs", {"model": "nope", "env": [{"id": "lab/nope"}], "colour": "red"}, 400),
        ("post", "/api/v1/jobs/estimate", "/api/v1/jobs/estimate", [1, 2], 400),
        ("get", "/api/v1/jobs?limit=0", "/api/v1/jobs", None, 400),
        ("get", "/api/v1/jobs/job_missing", "/api/v1/jobs/{job_id}", None, 404),
        ("get", "/api/v1/models/nobody/nothing/archive", "/api/v1/models/{owner}/{name}/archive", None, 404),
        ("post", "/api/v1/webhook-endpoints", "/api/v1/webhook-endpoints", {"url": "ftp://a.b", "events": ["x"]}, 400),
        ("delete", "/api/v1/webhook-endpoints/whep_missing", "/api/v1/webhook-endpoints/{endpoint_id}", None, 404),
    ],
)
def test_error_answers_match_the_error_component(document, owner, method, url, path, body, status):
    response = getattr(owner.client(), method)(url, body, format="json")
    assert response.status_code == status
    assert str(status) in document["paths"][path][method]["responses"]
    assert_matches(document, "Error", response.json())


def test_an_unauthenticated_answer_matches_the_error_component(document):
    response = APIClient().get("/api/v1/jobs")
    assert response.status_code == 401
    assert_matches(document, "Error", response.json())


def test_the_closed_check_catches_a_field_the_component_does_not_list(document):
    body = {"object": "list", "data": [], "has_more": False}
    assert_matches(document, "JobList", body)
    with pytest.raises(AssertionError):
        assert_matches(document, "JobList", copy.deepcopy(body) | {"total": 0})
