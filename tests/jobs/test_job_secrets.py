"""Job secrets (jobs/secrets/services.py): write-only beside the spec, encrypted at rest, in the
engine's environment only, never in an answer, event, log line, webhook or any stored row."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test import override_settings
from rest_framework.test import APIClient

from jobs.ingest.tokens import job_token
from jobs.models import Job, JobSecrets
from jobs.secrets.services import MAX_SECRETS_BYTES, engine_secrets
from jobs.services import job_claim_for_start, job_transition
from jobs.webhooks.models import WebhookMessage

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks")]

SECRET = "sk-test-4f9c2e7a1b"


def create(tenant, spec, secrets, path="/api/v1/jobs"):
    return tenant.client().post(path, {**spec, "secrets": secrets}, format="json")


def database_text() -> str:
    """Every row of every table of this database, as JSON text."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [row[0] for row in cursor.fetchall()]
        dumped = []
        for table in tables:
            cursor.execute(f'SELECT coalesce(json_agg(t)::text, \'\') FROM "{table}" t')
            dumped.append(cursor.fetchone()[0])
    return "\n".join(dumped)


def test_it_stores_secrets_encrypted_and_never_answers_them(owner, spec, no_broker):
    response = create(owner, spec, {"OPENAI_API_KEY": SECRET, "HF_TOKEN": "hf_abcdef"})

    assert response.status_code == 201, response.content
    assert SECRET not in response.content.decode()
    job = Job.objects.unscoped().get()
    row = JobSecrets.objects.unscoped().get(job=job)
    assert row.names == ["HF_TOKEN", "OPENAI_API_KEY"]
    assert SECRET.encode() not in bytes(row.ciphertext)
    assert engine_secrets(job_id=job.public_id) == {"OPENAI_API_KEY": SECRET, "HF_TOKEN": "hf_abcdef"}
    for path in (f"/api/v1/jobs/{job.public_id}", "/api/v1/jobs", f"/api/v1/jobs/{job.public_id}/events"):
        assert SECRET not in owner.client().get(path).content.decode()
    assert "secrets" not in job.spec


@pytest.mark.parametrize("secrets, param", [
    ("KEY=value", "secrets"),
    ({"1ABC": "x"}, "secrets.1ABC"),
    ({"WITH-DASH": "x"}, "secrets.WITH-DASH"),
    ({"LAB_JOB_TOKEN": "x"}, "secrets.LAB_JOB_TOKEN"),
    ({"PYTHONPATH": "/tmp"}, "secrets.PYTHONPATH"),
    ({"KEY": 5}, "secrets.KEY"),
    ({"KEY": "a\x00b"}, "secrets.KEY"),
    ({"KEY": "x" * MAX_SECRETS_BYTES}, "secrets"),
    ({f"K{index}": "v" for index in range(101)}, "secrets"),
])
def test_bad_secrets_are_a_400_that_creates_nothing_and_never_echo_a_value(owner, spec, no_broker, secrets, param):
    response = create(owner, spec, secrets)

    assert response.status_code == 400, response.content
    assert (response.json()["error"]["code"], response.json()["error"]["param"]) == ("invalid_request", param)
    assert "a\x00b" not in response.content.decode() and "/tmp" not in response.content.decode()
    assert Job.objects.unscoped().count() == 0 and JobSecrets.objects.unscoped().count() == 0


def test_a_teachers_api_key_var_must_be_among_the_secrets(owner, spec, no_broker):
    teacher = {"model": "t", "client": {"base_url": "https://teacher.example/v1", "api_key_var": "OPENAI_API_KEY"}}
    sft = {**spec, "loss": "sft", "teacher": teacher}

    missing = create(owner, sft, {"OTHER": "x"})
    estimate = create(owner, sft, {}, path="/api/v1/jobs/estimate")
    given = create(owner, sft, {"OPENAI_API_KEY": SECRET})

    assert missing.status_code == 400
    assert missing.json()["error"]["errors"] == [{
        "param": "teacher.client.api_key_var", "code": "missing_secret",
        "message": "'OPENAI_API_KEY' is not among the job's secrets (given: OTHER); pass it with -e "
                   "OPENAI_API_KEY=... or an env file, or as secrets.OPENAI_API_KEY in the request",
    }]
    assert estimate.status_code == 400 and estimate.json()["error"]["errors"][0]["code"] == "missing_secret"
    assert given.status_code == 201, given.content
    assert Job.objects.unscoped().count() == 1


def test_a_teacher_without_a_client_is_prime_inference_and_needs_prime_api_key(owner, spec, no_broker):
    sft = {**spec, "loss": "sft", "teacher": {"model": "openai/gpt-oss-120b"}}

    missing = create(owner, sft, {})
    given = create(owner, sft, {"PRIME_API_KEY": SECRET})

    assert missing.status_code == 400
    assert [(e["param"], e["code"]) for e in missing.json()["error"]["errors"]] == [("teacher", "missing_secret")]
    assert "'PRIME_API_KEY' is not among the job's secrets (given: none)" in missing.json()["error"]["errors"][0]["message"]
    assert given.status_code == 201, given.content
    assert Job.objects.unscoped().count() == 1


@override_settings(LAB_WEBHOOK_ALLOW_PRIVATE=True)
def test_nothing_a_job_produced_holds_a_secret(owner, outsider, spec, no_broker):
    owner.client().post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "events": ["job.failed"]},
                        format="json")
    assert create(owner, spec, {"OPENAI_API_KEY": SECRET, "SHORT": "abc"}).status_code == 201
    job = Job.objects.unscoped().get()
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    base = f"/api/v1/ingest/jobs/{job.public_id}"
    lines = {"attempt": 1, "lines": [
        {"seq": 1, "time": "2026-11-29T22:16:31Z", "stream": "stdout", "line": f"using key {SECRET} now"},
        {"seq": 2, "time": "2026-11-29T22:16:32Z", "stream": "stderr", "line": f"Bearer {SECRET}{SECRET}"},
    ]}
    assert engine.post(f"{base}/logs", lines, format="json").status_code == 200
    job_transition(job=job, to="failed", error_code="environment_error",
                   error_message=f"the endpoint refused key {SECRET}", message=f"failed with {SECRET}")

    logs = owner.client().get(f"/api/v1/jobs/{job.public_id}/logs").json()["data"]
    assert [line["line"] for line in logs] == ["using key *** now", "Bearer ******"]
    failed = owner.client().get(f"/api/v1/jobs/{job.public_id}").json()
    assert failed["error"] == {"code": "environment_error", "message": "the endpoint refused key ***"}
    assert WebhookMessage.objects.filter(type="job.failed").count() == 1
    answers = "".join(
        owner.client().get(path).content.decode()
        for path in (f"/api/v1/jobs/{job.public_id}", f"/api/v1/jobs/{job.public_id}/events",
                     f"/api/v1/jobs/{job.public_id}/logs", "/api/v1/jobs")
    )
    assert SECRET not in answers
    browser = Client()
    browser.force_login(owner.user)
    pages = [browser.get(f"/o/acme/p/default/jobs/{job.public_id}/"), browser.get("/o/acme/p/default/")]
    assert [page.status_code for page in pages] == [200, 200]
    assert job.public_id in pages[0].content.decode()
    assert not any(SECRET in page.content.decode() for page in pages)
    assert SECRET not in database_text()
    assert outsider.client().get(f"/api/v1/jobs/{job.public_id}").status_code == 404


def test_secrets_key_rotation_keeps_old_secrets_readable(owner, spec, no_broker, settings):
    from cryptography.fernet import Fernet
    from django.core.exceptions import ImproperlyConfigured

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.LAB_SECRETS_KEY = old
    assert create(owner, spec, {"OPENAI_API_KEY": SECRET}).status_code == 201
    job_id = Job.objects.unscoped().get().public_id

    settings.LAB_SECRETS_KEY = f"{new},{old}"
    assert engine_secrets(job_id=job_id) == {"OPENAI_API_KEY": SECRET}
    settings.LAB_SECRETS_KEY = new
    with pytest.raises(ImproperlyConfigured, match="LAB_SECRETS_KEY must keep the key"):
        engine_secrets(job_id=job_id)
    settings.LAB_SECRETS_KEY = "not-a-key"
    with pytest.raises(ImproperlyConfigured, match="must be Fernet keys"):
        engine_secrets(job_id=job_id)


def test_an_idempotent_create_replays_without_the_secrets_and_keeps_no_plain_hash_of_them(owner, spec, no_broker):
    import hashlib

    from lab.models import IdempotencyRecord

    body = json.dumps({**spec, "secrets": {"OPENAI_API_KEY": SECRET}})
    first = owner.client().post("/api/v1/jobs", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1")
    replay = owner.client().post("/api/v1/jobs", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1")

    assert first.status_code == replay.status_code == 201
    assert replay.json() == first.json() and SECRET not in replay.content.decode()
    assert Job.objects.unscoped().count() == 1
    plain = hashlib.sha256(b"POST\0/api/v1/jobs\0" + body.encode()).hexdigest()
    assert IdempotencyRecord.objects.get().request_hash != plain  # keyed: no offline guessing of a secret


def test_an_engines_samples_outcome_and_refused_spool_records_never_store_a_secret(owner, spec, no_broker, tmp_path):
    from engine.spool import Spool, attempt_spool_dir
    from jobs.ingest.spool import deliver_attempt_spool
    from jobs.models import JobAttempt

    assert create(owner, spec, {"OPENAI_API_KEY": SECRET}).status_code == 201
    job = Job.objects.unscoped().get()
    attempt = job_claim_for_start(job_id=job.pk)
    engine = APIClient()
    engine.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    base = f"/api/v1/ingest/jobs/{job.public_id}"
    sample = {"step": 1, "group": 0, "prompt": f"Call it with {SECRET}.", "completion": f"The key is {SECRET}",
              "reward": 1.0, "advantage": 0.0}
    assert engine.post(f"{base}/samples", {"attempt": 1, "samples": [sample]}, format="json").status_code == 200
    status = {"attempt": 1, "phase": "running", "step": 1, "message": f"calling with {SECRET}"}
    assert engine.post(f"{base}/status", status, format="json").status_code == 200
    outcome = {"attempt": 1, "outcome": "failed", "error": {"code": "environment_error", "message": f"401 for {SECRET}"}}
    assert engine.post(f"{base}/finish", outcome, format="json").status_code == 200
    # A spooled record Lab refuses names what was wrong with it, here a metric named after the secret.
    workdir = tmp_path / "attempt-1"
    spooled = Spool(attempt_spool_dir(workdir, 1), "metrics")
    spooled.append({"step": 1, "time": "2026-11-29T22:16:31Z", "values": {SECRET: "high"}})
    spooled.close()

    delivery = deliver_attempt_spool(attempt=attempt, workdir=workdir)

    assert delivery.problems == ["metrics: malformed record (points.0.values.***: Input should be a valid number)"]
    samples = owner.client().get(f"/api/v1/jobs/{job.public_id}/samples?step=1").json()["data"]
    assert [(row["prompt"], row["completion"]) for row in samples] == [("Call it with ***.", "The key is ***")]
    assert JobAttempt.objects.get(pk=attempt.pk).outcome_error == {"code": "environment_error", "message": "401 for ***"}
    assert SECRET not in database_text()
