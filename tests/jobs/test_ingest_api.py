"""The ingest API engines report to (docs/ingest-api.md), driven as an engine would."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.ingest.tokens import job_token
from jobs.models import Checkpoint, Job, JobEvent, JobStatus, LogLine, MetricStep, RolloutSample
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

NOW = "2026-11-29T22:16:31Z"


def start(owner, spec) -> tuple[Job, APIClient, str]:
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(attempt)}")
    return Job.objects.unscoped().get(pk=job.pk), client, f"/api/v1/ingest/jobs/{job.public_id}"


def point(step: int, **values: float) -> dict:
    return {"step": step, "time": NOW, "values": values}


def test_a_heartbeat_moves_the_job_to_running_and_answers_continue(owner, spec):
    job, client, base = start(owner, spec)
    loading = client.post(f"{base}/status", {"attempt": 1, "phase": "loading", "step": 0}, format="json")
    assert loading.status_code == 200
    assert loading.json() == {"action": "continue"}
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.STARTING
    running = client.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 1}, format="json")
    assert running.json() == {"action": "continue"}
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert job.started_at is not None
    assert job.step == 1
    assert job.attempts.get().last_heartbeat_at is not None


def test_a_cancelled_job_is_told_to_stop(owner, spec):
    job, client, base = start(owner, spec)
    client.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 0}, format="json")
    owner.client().post(f"/api/v1/jobs/{job.public_id}/cancel")
    answer = client.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 1}, format="json")
    assert answer.json() == {"action": "stop"}


def test_metrics_are_stored_once_per_step_and_merged(owner, spec):
    job, client, base = start(owner, spec)
    batch = {"attempt": 1, "points": [point(1, **{"reward/mean": 0.1, "loss/mean": 2.0}), point(2, **{"reward/mean": 0.2})]}
    assert client.post(f"{base}/metrics", batch, format="json").json() == {"accepted": 2, "duplicates": 0, "superseded": 0}
    assert client.post(f"{base}/metrics", batch, format="json").json() == {"accepted": 0, "duplicates": 2, "superseded": 0}
    late_eval = {"attempt": 1, "points": [point(2, **{"eval/addition/mean": 0.5, "reward/mean": 9.0})]}
    assert client.post(f"{base}/metrics", late_eval, format="json").json() == {"accepted": 1, "duplicates": 0, "superseded": 0}
    rows = {row.step: row.values for row in MetricStep.objects.filter(job=job)}
    assert rows == {
        1: {"reward/mean": 0.1, "loss/mean": 2.0},
        2: {"reward/mean": 0.2, "eval/addition/mean": 0.5},
    }
    assert Job.objects.unscoped().get(pk=job.pk).step == 2
    listed = owner.client().get(f"/api/v1/jobs/{job.public_id}/metrics").json()
    assert listed["data"] == [
        {"step": 1, "time": NOW, "attempt": 1, "values": {"reward/mean": 0.1, "loss/mean": 2.0}},
        {"step": 2, "time": NOW, "attempt": 1, "values": {"reward/mean": 0.2, "eval/addition/mean": 0.5}},
    ]


def test_a_newer_attempt_supersedes_and_an_older_one_is_refused(owner, spec):
    job, first, base = start(owner, spec)
    first.post(f"{base}/metrics", {"attempt": 1, "points": [point(1, r=1.0), point(2, r=2.0)]}, format="json")
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.RUNNING  # data proves the attempt is training
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.QUEUED, reason="requeued_after_crash")
    second_attempt = job_claim_for_start(job_id=job.pk)
    second = APIClient()
    second.credentials(HTTP_AUTHORIZATION=f"Bearer {job_token(second_attempt)}")
    answer = second.post(f"{base}/metrics", {"attempt": 2, "points": [point(2, r=20.0), point(3, r=30.0)]}, format="json")
    assert answer.json() == {"accepted": 1, "duplicates": 0, "superseded": 1}
    stale = first.post(f"{base}/metrics", {"attempt": 1, "points": [point(4, r=4.0)]}, format="json")
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "stale_attempt"
    rows = {row.step: (row.attempt, row.values["r"]) for row in MetricStep.objects.filter(job=job)}
    assert rows == {1: (1, 1.0), 2: (2, 20.0), 3: (2, 30.0)}
    assert first.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 4}, format="json").json() == {
        "action": "stop"
    }


def test_a_token_works_only_for_its_job(owner, spec):
    job, client, base = start(owner, spec)
    other, _, other_base = start(owner, spec)
    response = client.post(f"{other_base}/metrics", {"attempt": 1, "points": [point(1, r=1.0)]}, format="json")
    assert response.status_code == 401
    assert not MetricStep.objects.exists()
    for header in ("", "Bearer ljt_1:bad", "Bearer " + owner.key, "Bearer ljt_999999:abc"):
        bad = APIClient()
        if header:
            bad.credentials(HTTP_AUTHORIZATION=header)
        assert bad.post(f"{base}/status", {"attempt": 1, "phase": "running"}, format="json").status_code == 401
    # A job token is no API key either.
    assert client.get("/api/v1/whoami").status_code == 401
    assert client.get(f"/api/v1/jobs/{job.public_id}").status_code == 401


def test_a_token_expires_an_hour_after_the_job_ends(owner, spec):
    job, client, base = start(owner, spec)
    client.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 1}, format="json")
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    late = {"attempt": 1, "points": [point(1, r=1.0)]}
    assert client.post(f"{base}/metrics", late, format="json").status_code == 200
    Job.objects.unscoped().filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(hours=1, minutes=1))
    assert client.post(f"{base}/metrics", late, format="json").status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"attempt": 1, "points": [{"step": -1, "time": NOW, "values": {}}]},
        {"attempt": 1, "points": [{"step": 1, "time": "yesterday", "values": {}}]},
        {"attempt": 1, "points": [{"step": 1, "time": NOW, "values": {"r": "high"}}]},
        {"attempt": 1, "points": [{"step": 1, "time": NOW, "values": {"x" * 200: 1.0}}]},
        {"attempt": 1, "points": [{"step": 1, "time": NOW, "values": {"r": 1.0}, "extra": 1}]},
        {"attempt": 2, "points": []},
        {"points": []},
        [],
    ],
)
def test_bad_metric_batches_are_refused_and_change_nothing(owner, spec, body):
    job, client, base = start(owner, spec)
    response = client.post(f"{base}/metrics", body, format="json")
    assert response.status_code == 400, response.content
    assert not MetricStep.objects.exists()


def test_non_finite_values_are_refused(owner, spec):
    job, client, base = start(owner, spec)
    body = '{"attempt": 1, "points": [{"step": 1, "time": "2026-11-29T22:16:31Z", "values": {"loss/mean": NaN}}]}'
    assert client.post(f"{base}/metrics", body, content_type="application/json").status_code == 400
    assert not MetricStep.objects.exists()


def test_more_than_a_thousand_points_is_413(owner, spec):
    job, client, base = start(owner, spec)
    body = {"attempt": 1, "points": [point(step, r=1.0) for step in range(1001)]}
    response = client.post(f"{base}/metrics", body, format="json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert not MetricStep.objects.exists()


@override_settings(LAB_INGEST_RATE_LIMIT_PER_MINUTE=3)
def test_a_flooding_engine_gets_429_with_retry_after(owner, spec):
    job, client, base = start(owner, spec)
    statuses = [client.post(f"{base}/status", {"attempt": 1, "phase": "loading"}, format="json").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    limited = client.post(f"{base}/status", {"attempt": 1, "phase": "loading"}, format="json")
    assert int(limited["Retry-After"]) >= 1


def test_samples_and_logs_are_stored_and_listed(owner, spec):
    job, client, base = start(owner, spec)
    sample = {"step": 1, "group": 0, "prompt": "2+2=", "completion": "4", "reward": 1.0, "advantage": 0.5, "metrics": {"correct": 1.0}}
    batch = {"attempt": 1, "samples": [sample, dict(sample, group=1, reward=0.0, advantage=-0.5)]}
    assert client.post(f"{base}/samples", batch, format="json").json() == {"accepted": 2}
    assert client.post(f"{base}/samples", batch, format="json").json() == {"accepted": 2}
    assert RolloutSample.objects.filter(job=job).count() == 2
    samples = owner.client().get(f"/api/v1/jobs/{job.public_id}/samples?step=1").json()["data"]
    assert [(s["group"], s["reward"], s["advantage"]) for s in samples] == [(0, 1.0, 0.5), (1, 0.0, -0.5)]
    lines = {"attempt": 1, "lines": [{"seq": i, "time": NOW, "stream": "stdout", "line": f"line {i}"} for i in range(3)]}
    assert client.post(f"{base}/logs", lines, format="json").json() == {"accepted": 3, "duplicates": 0}
    assert client.post(f"{base}/logs", lines, format="json").json() == {"accepted": 0, "duplicates": 3}
    first = owner.client().get(f"/api/v1/jobs/{job.public_id}/logs?limit=2").json()
    assert [line["line"] for line in first["data"]] == ["line 0", "line 1"]
    assert first["has_more"] is True
    rest = owner.client().get(f"/api/v1/jobs/{job.public_id}/logs?after={first['data'][-1]['seq']}").json()
    assert [line["line"] for line in rest["data"]] == ["line 2"]
    assert LogLine.objects.filter(job=job).count() == 3


def test_a_checkpoint_is_ready_only_when_what_is_stored_matches(owner, spec):
    spec["checkpoints"] = {"interval": 1, "keep_last": 1}
    job, client, base = start(owner, spec)
    registered = client.post(f"{base}/checkpoints", {"attempt": 1, "step": 1, "format": "peft-lora"}, format="json")
    assert registered.status_code == 201
    body = registered.json()
    assert body["id"].startswith("ckpt_")
    assert body["upload"]["method"] == "local"
    archive = Path(body["upload"]["path"])
    archive.write_bytes(b"weights" * 100)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    wrong = client.post(f"{base}/checkpoints/{body['id']}/complete", {"size_bytes": 700, "sha256": "0" * 64}, format="json")
    assert wrong.json()["status"] == "failed"
    assert not archive.exists()
    second = client.post(f"{base}/checkpoints", {"attempt": 1, "step": 2, "format": "peft-lora"}, format="json").json()
    Path(second["upload"]["path"]).write_bytes(b"weights" * 100)
    ready = client.post(f"{base}/checkpoints/{second['id']}/complete", {"size_bytes": 700, "sha256": digest}, format="json")
    assert ready.json() == {"id": second["id"], "status": "ready"}
    assert JobEvent.objects.filter(job=job, type="checkpoint.ready").count() == 1
    assert JobEvent.objects.filter(job=job, type="checkpoint.failed").count() == 1
    third = client.post(f"{base}/checkpoints", {"attempt": 1, "step": 3, "format": "peft-lora"}, format="json").json()
    Path(third["upload"]["path"]).write_bytes(b"newer")
    client.post(
        f"{base}/checkpoints/{third['id']}/complete",
        {"size_bytes": 5, "sha256": hashlib.sha256(b"newer").hexdigest()},
        format="json",
    )
    # keep_last = 1: the older ready checkpoint and its archive are gone.
    assert list(Checkpoint.objects.unscoped().filter(job=job, status="ready").values_list("public_id", flat=True)) == [third["id"]]
    assert not Path(second["upload"]["path"]).exists()
    listed = owner.client().get(f"/api/v1/jobs/{job.public_id}").json()["latest_checkpoint"]
    assert listed["id"] == third["id"]
    assert listed["sha256"] == hashlib.sha256(b"newer").hexdigest()


def test_finish_records_the_outcome(owner, spec):
    job, client, base = start(owner, spec)
    body = {"attempt": 1, "outcome": "failed", "error": {"code": "environment_error", "message": "bad env"}}
    assert client.post(f"{base}/finish", body, format="json").status_code == 200
    attempt = job.attempts.get()
    assert attempt.outcome == "failed"
    assert attempt.outcome_error == {"code": "environment_error", "message": "bad env"}


def test_unstorable_text_is_cleaned_in_logs_and_refused_in_metric_names(owner, spec):
    job, client, base = start(owner, spec)
    body = '{"attempt": 1, "lines": [{"seq": 1, "time": "2026-11-29T22:16:31Z", "line": "a\\u0000b \\ud800"}]}'
    assert client.post(f"{base}/logs", body, content_type="application/json").status_code == 200
    assert LogLine.objects.get(job=job).line == "a\ufffdb ?"
    bad = '{"attempt": 1, "points": [{"step": 1, "time": "2026-11-29T22:16:31Z", "values": {"r\\u0000": 1.0}}]}'
    assert client.post(f"{base}/metrics", bad, content_type="application/json").status_code == 400
    assert not MetricStep.objects.exists()


def test_json_nested_past_the_recursion_limit_is_400(owner, spec):
    job, client, base = start(owner, spec)
    deep = b'{"attempt": 1, "points": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = client.post(f"{base}/metrics", deep, content_type="application/json")
    assert response.status_code == 400
    assert not MetricStep.objects.exists()


def test_it_refuses_metrics_and_samples_beyond_max_steps_and_stores_nothing(owner, spec):
    job, client, base = start(owner, spec)  # max_steps 3
    metrics = client.post(f"{base}/metrics", {"attempt": 1, "points": [point(3, r=1.0), point(4, r=1.0)]}, format="json")
    assert metrics.status_code == 409
    assert metrics.json()["error"]["code"] == "invalid_step"
    assert metrics.json()["error"]["message"] == "metrics for step 4: this job has 3 steps."
    sample = {"step": 4, "group": 0, "prompt": "p", "completion": "c", "reward": 1.0, "advantage": 0.0}
    samples = client.post(f"{base}/samples", {"attempt": 1, "samples": [sample]}, format="json")
    assert (samples.status_code, samples.json()["error"]["code"]) == (409, "invalid_step")
    assert not MetricStep.objects.filter(job=job).exists() and not RolloutSample.objects.filter(job=job).exists()


def test_after_the_end_it_takes_late_reports_of_steps_that_happened_only(owner, spec):
    job, client, base = start(owner, spec)
    client.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 2}, format="json")
    job_transition(job=Job.objects.unscoped().get(pk=job.pk), to=JobStatus.SUCCEEDED)
    # A heartbeat after the end cannot widen the window.
    client.post(f"{base}/status", {"attempt": 1, "phase": "running", "step": 3}, format="json")
    assert Job.objects.unscoped().get(pk=job.pk).step == 2
    late = client.post(f"{base}/metrics", {"attempt": 1, "points": [point(1, r=1.0), point(2, r=1.0)]}, format="json")
    assert late.status_code == 200 and late.json()["accepted"] == 2
    never = client.post(f"{base}/metrics", {"attempt": 1, "points": [point(3, r=1.0)]}, format="json")
    assert never.status_code == 409
    assert never.json()["error"]["message"] == (
        "metrics for step 3: this job ended at step 2 and takes late reports of its steps only."
    )
    assert sorted(MetricStep.objects.filter(job=job).values_list("step", flat=True)) == [1, 2]


def test_registering_the_same_step_of_an_attempt_twice_returns_the_same_checkpoint(owner, spec):
    job, client, base = start(owner, spec)
    body = {"attempt": 1, "step": 1, "format": "peft-lora"}
    first = client.post(f"{base}/checkpoints", body, format="json").json()
    again = client.post(f"{base}/checkpoints", body, format="json").json()
    assert first["id"] == again["id"] and first["upload"] == again["upload"]
    assert Checkpoint.objects.unscoped().filter(job=job).count() == 1


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("metrics", {"attempt": 1, "points": [point(1, r=1.0), {"step": 2, "time": NOW, "values": {"r": "0.5"}}]}, "points.1.values.r"),
        ("metrics", {"attempt": 1, "points": [{"step": 1, "time": NOW, "values": {"r": True}}]}, "points.0.values.r"),
        ("samples", {"attempt": 1, "samples": [
            {"step": 1, "group": 0, "prompt": "p", "completion": "c", "reward": "1.0", "advantage": 0.0},
        ]}, "samples.0.reward"),
        ("samples", {"attempt": 1, "samples": [
            {"step": 1, "group": 0, "prompt": "p", "completion": "c", "reward": 1.0, "advantage": False},
        ]}, "samples.0.advantage"),
        ("samples", {"attempt": 1, "samples": [
            {"step": 1, "group": 0, "prompt": "p", "completion": "c", "reward": 1.0, "advantage": 0.0, "metrics": {"m": "1"}},
        ]}, "samples.0.metrics.m"),
    ],
)
def test_a_number_sent_as_a_string_or_a_boolean_is_refused_and_stores_nothing(owner, spec, route, body, param):
    job, client, base = start(owner, spec)
    answer = client.post(f"{base}/{route}", body, format="json")
    assert answer.status_code == 400, answer.content
    assert (answer.json()["error"]["code"], answer.json()["error"]["param"]) == ("invalid_request", param)
    assert not MetricStep.objects.filter(job=job).exists() and not RolloutSample.objects.filter(job=job).exists()


def test_integer_metric_values_are_stored_as_numbers(owner, spec):
    job, client, base = start(owner, spec)
    answer = client.post(f"{base}/metrics", {"attempt": 1, "points": [point(1, r=1, loss=0.5)]}, format="json")
    assert answer.json() == {"accepted": 1, "duplicates": 0, "superseded": 0}
    assert MetricStep.objects.get(job=job).values == {"r": 1.0, "loss": 0.5}
