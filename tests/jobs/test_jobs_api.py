"""The jobs REST API: create, list, retrieve, cancel, events, estimate, catalogues (docs/api.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.models import Checkpoint, CheckpointStatus, Job, JobAttempt, JobEvent, JobStatus
from jobs.services import job_claim_for_start, job_submit, job_transition
from lab.audit import Actor
from lab.services import api_key_create

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("default_prices")]

DEEP: list = [1]
for _ in range(40):
    DEEP = [DEEP]


def test_it_creates_a_queued_job(owner, spec):
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.unscoped().get()
    assert body["id"] == job.public_id
    assert body["id"].startswith("job_")
    assert body["object"] == "job"
    assert body["name"] == "addition-tiny"
    assert body["status"] == "queued"
    assert body["status_reason"] == "waiting"
    assert body["queue_position"] == 1
    assert body["attempt"] == 0
    assert body["step"] == 0
    assert body["max_steps"] == 3
    assert body["warnings"] == []
    assert body["error"] is None
    assert body["latest_checkpoint"] is None
    assert body["metadata"] == {"team": "research"}
    assert body["usage"] == {"gpu_seconds": 0.0, "cpu_seconds": 0.0, "cost_usd": "0.00"}
    assert body["spec"]["env"] == [{"id": "lab/addition", "args": {"max_operand": 9}}]
    assert body["spec"]["learning_rate"] > 0
    assert body["created_at"].endswith("Z")
    assert body["started_at"] is None
    assert set(body) >= {
        "id", "object", "name", "status", "status_reason", "queue_position", "spec", "warnings", "attempt",
        "step", "max_steps", "created_at", "started_at", "finished_at", "error", "usage", "latest_checkpoint",
        "metadata",
    }
    assert list(JobEvent.objects.filter(job=job).values_list("type", flat=True)) == ["job.queued"]
    assert job.project == owner.project


def test_it_accepts_a_spec_with_only_prime_keys_and_warns(owner):
    prime = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "max_steps": 20,
        "batch_size": 32,
        "rollouts_per_example": 4,
        "learning_rate": 5e-4,
        "lora_alpha": 32,
        "oversampling_factor": 1.5,
        "max_async_level": 2,
        "trajectory_strategy": "interleaved",
        "sampling": {"max_tokens": 24, "temperature": 1.0, "enable_thinking": False},
        "env": [{"id": "lab/addition"}],
        "wandb": {"project": "x"},
    }
    response = owner.client().post("/api/v1/jobs", prime, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    warned = " ".join(body["warnings"])
    for key in ("oversampling_factor", "max_async_level", "trajectory_strategy", "wandb"):
        assert key in warned
    assert "enable_thinking" not in warned  # passed to the chat template (the engine's log says when it has no use for it)
    assert body["spec"]["oversampling_factor"] == 1.5
    assert body["spec"]["wandb"] == {"project": "x"}


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        (lambda s: s.update(model="meta/llama-9000"), "model", "unknown_model"),
        (lambda s: s["env"][0].update(id="primeintellect/reverse-text"), "env.0.id", "unknown_environment"),
        (lambda s: s["env"][0]["args"].update(nope=1), "env.0.args.nope", "unknown_key"),
        (lambda s: s["env"][0]["args"].update(max_operand="big"), "env.0.args.max_operand", "invalid_type"),
        (lambda s: s["sampling"].update(max_tokens=100_000), "sampling.max_tokens", "out_of_range"),
        (lambda s: s.update(resources={"gpu_type": "H100", "gpus": 1}), "resources.gpu_type", "unavailable_resource"),
        (lambda s: s.update(resources={"gpu_type": "cpu", "gpus": 2}), "resources.gpus", "invalid_value"),
        (lambda s: s.update(init_from="ckpt_doesnotexist"), "init_from", "unknown_checkpoint"),
        (lambda s: s.update(batch_size=10), "batch_size", "not_divisible"),
        (lambda s: s.update(surprise=True), "surprise", "unknown_key"),
        (lambda s: s.update(max_steps=0), "max_steps", "out_of_range"),
        (lambda s: s.update(max_steps="3"), "max_steps", "invalid_type"),
        (lambda s: s.pop("model"), "model", "required"),
    ],
)
def test_it_refuses_bad_specs_with_the_path_and_creates_nothing(owner, spec, change, param, code):
    change(spec)
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_spec"
    assert error["param"] == param
    assert (param, code) in [(item["param"], item["code"]) for item in error["errors"]]
    assert Job.objects.unscoped().count() == 0
    assert JobEvent.objects.count() == 0


def test_it_reports_every_problem_at_once(owner, spec):
    spec.update(batch_size=10, model="nope/nope")
    spec["env"][0]["id"] = "primeintellect/reverse-text"
    spec["sampling"]["temperature"] = 9
    errors = owner.client().post("/api/v1/jobs", spec, format="json").json()["error"]["errors"]
    found = {(item["param"], item["code"]) for item in errors}
    assert {
        ("batch_size", "not_divisible"),
        ("sampling.temperature", "out_of_range"),
        ("model", "unknown_model"),
        ("env.0.id", "unknown_environment"),
    } <= found


def test_an_unknown_environment_lists_the_installed_ones(owner, spec):
    spec["env"][0]["id"] = "primeintellect/reverse-text"
    error = owner.client().post("/api/v1/jobs", spec, format="json").json()["error"]
    message = error["errors"][0]["message"]
    for installed in ("lab/addition", "lab/reverse-text", "lab/alphabet-sort"):
        assert installed in message


def test_init_from_another_projects_checkpoint_reads_like_a_missing_one(owner, outsider, spec):
    foreign_job = Job.objects.create(project=outsider.project, spec={}, max_steps=1, model="m")
    foreign = Checkpoint.objects.create(job=foreign_job, step=1, attempt=1, format="peft-lora", status=CheckpointStatus.READY)
    spec["init_from"] = foreign.public_id
    foreign_error = owner.client().post("/api/v1/jobs", spec, format="json").json()["error"]
    spec["init_from"] = "ckpt_missing0000000000"
    missing_error = owner.client().post("/api/v1/jobs", spec, format="json").json()["error"]
    assert foreign_error["param"] == missing_error["param"] == "init_from"
    assert foreign_error["errors"][0]["code"] == missing_error["errors"][0]["code"] == "unknown_checkpoint"
    assert Job.objects.unscoped().filter(project=owner.project).count() == 0


def _ready_checkpoint_of(owner, spec) -> Checkpoint:
    source = Job.objects.unscoped().get(public_id=owner.client().post("/api/v1/jobs", spec, format="json").json()["id"])
    return Checkpoint.objects.create(job=source, step=1, attempt=1, format="peft-lora", status=CheckpointStatus.READY)


def test_init_from_a_ready_checkpoint_of_the_project_is_accepted(owner, spec):
    checkpoint = _ready_checkpoint_of(owner, dict(spec))
    spec["init_from"] = checkpoint.public_id
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 201
    assert Job.objects.unscoped().get(public_id=response.json()["id"]).init_from == checkpoint


@pytest.mark.parametrize(
    ("change", "param", "message"),
    [
        ({"model": "HuggingFaceTB/SmolLM2-135M-Instruct"}, "init_from", "was trained from lab/tiny-random-llama"),
        ({"lora_rank": 4}, "lora_rank", "has lora_rank 16 (0 = full weights); this job asks for 4"),
        ({"lora_rank": 0}, "lora_rank", "this job asks for 0"),
    ],
)
def test_init_from_a_checkpoint_that_does_not_fit_the_job_is_refused_at_submit(owner, spec, change, param, message):
    checkpoint = _ready_checkpoint_of(owner, {**spec, "lora_rank": 16})
    before = Job.objects.unscoped().count()
    response = owner.client().post("/api/v1/jobs", {**spec, **change, "init_from": checkpoint.public_id}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["errors"][0]["code"]) == (param, "incompatible_checkpoint")
    assert message in error["errors"][0]["message"]
    assert Job.objects.unscoped().count() == before


@pytest.mark.parametrize(
    "body",
    [b"[]", b'"spec"', b"null", b"42", json.dumps({"model": "lab/tiny-random-llama", "env": [{"id": "lab/addition", "args": {"a": DEEP}}]}).encode()],
)
def test_it_refuses_non_object_and_hostile_bodies(owner, body):
    response = owner.client().post("/api/v1/jobs", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] in {"invalid_spec", "invalid_request"}
    assert Job.objects.unscoped().count() == 0


def test_it_refuses_huge_numbers_and_non_finite_floats(owner, spec):
    for value in (10**40, float("inf")):
        spec["learning_rate"] = value
        body = json.dumps(spec, allow_nan=True)
        response = owner.client().post("/api/v1/jobs", data=body, content_type="application/json")
        assert response.status_code == 400, response.content
    assert Job.objects.unscoped().count() == 0


def test_a_read_key_cannot_create_or_cancel_but_can_estimate(owner, spec):
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    client = owner.client(read_key)
    assert client.post("/api/v1/jobs", spec, format="json").status_code == 403
    assert Job.objects.unscoped().count() == 0
    job = owner.client().post("/api/v1/jobs", spec, format="json").json()
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 403
    assert Job.objects.unscoped().get().status == "queued"
    assert client.post("/api/v1/jobs/estimate", spec, format="json").status_code == 200
    assert client.get(f"/api/v1/jobs/{job['id']}").status_code == 200


def test_an_outsider_gets_404_for_every_job_endpoint_and_changes_nothing(owner, outsider, spec):
    job_id = owner.client().post("/api/v1/jobs", spec, format="json").json()["id"]
    client = outsider.client()
    for method, path in [
        ("get", f"/api/v1/jobs/{job_id}"),
        ("post", f"/api/v1/jobs/{job_id}/cancel"),
        ("get", f"/api/v1/jobs/{job_id}/events"),
    ]:
        response = getattr(client, method)(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
        missing = getattr(client, method)(path.replace(job_id, "job_00000000000000000000"))
        assert missing.json() == response.json()
    assert client.get("/api/v1/jobs").json()["data"] == []
    assert Job.objects.unscoped().get().status == "queued"
    assert JobEvent.objects.count() == 1


def test_create_replays_with_the_same_idempotency_key(owner, spec):
    client = owner.client()
    first = client.post("/api/v1/jobs", spec, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    second = client.post("/api/v1/jobs", spec, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert Job.objects.unscoped().count() == 1
    spec["name"] = "other"
    conflict = client.post("/api/v1/jobs", spec, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "idempotency_conflict"
    assert Job.objects.unscoped().count() == 1


def test_a_failed_create_does_not_burn_the_idempotency_key(owner, spec):
    client = owner.client()
    bad = dict(spec, max_steps=0)
    assert client.post("/api/v1/jobs", bad, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 400
    assert client.post("/api/v1/jobs", bad, format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 400
    assert Job.objects.unscoped().count() == 0


def test_it_lists_newest_first_with_filters_and_pages(owner, spec):
    client = owner.client()
    ids = []
    for index in range(5):
        spec["metadata"] = {"team": "a" if index % 2 == 0 else "b", "run": str(index)}
        ids.append(client.post("/api/v1/jobs", spec, format="json").json()["id"])
    client.post(f"/api/v1/jobs/{ids[0]}/cancel")
    page = client.get("/api/v1/jobs?limit=2").json()
    assert [job["id"] for job in page["data"]] == [ids[4], ids[3]]
    assert page["has_more"] is True
    rest = client.get(f"/api/v1/jobs?limit=3&after={ids[3]}").json()
    assert [job["id"] for job in rest["data"]] == [ids[2], ids[1], ids[0]]
    assert rest["has_more"] is False
    team_a = client.get("/api/v1/jobs", {"metadata[team]": "a"}).json()
    assert [job["id"] for job in team_a["data"]] == [ids[4], ids[2], ids[0]]
    both = client.get("/api/v1/jobs", {"metadata[team]": "a", "metadata[run]": "2"}).json()
    assert [job["id"] for job in both["data"]] == [ids[2]]
    cancelled = client.get("/api/v1/jobs?status=cancelled").json()
    assert [job["id"] for job in cancelled["data"]] == [ids[0]]
    bad = client.get("/api/v1/jobs?status=exploded")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "status"


def test_queue_positions_follow_priority_then_age(owner, spec):
    client = owner.client()
    first = client.post("/api/v1/jobs", spec, format="json").json()
    second = client.post("/api/v1/jobs", spec, format="json").json()
    urgent = client.post("/api/v1/jobs", dict(spec, priority="high"), format="json").json()
    positions = {job: client.get(f"/api/v1/jobs/{job}").json()["queue_position"] for job in (first["id"], second["id"], urgent["id"])}
    assert positions == {urgent["id"]: 1, first["id"]: 2, second["id"]: 3}


def test_cancel_of_a_queued_job_is_immediate(owner, spec):
    client = owner.client()
    job_id = client.post("/api/v1/jobs", spec, format="json").json()["id"]
    body = client.post(f"/api/v1/jobs/{job_id}/cancel").json()
    assert body["status"] == "cancelled"
    assert body["queue_position"] is None
    assert body["finished_at"] is not None
    again = client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "invalid_state"
    events = client.get(f"/api/v1/jobs/{job_id}/events").json()
    assert [event["type"] for event in events["data"]] == ["job.queued", "job.cancelled"]
    assert events["data"][0]["id"].startswith("evt_")
    assert set(events["data"][1]) >= {"id", "created_at", "level", "type", "message", "data"}


def test_cancel_of_a_running_job_asks_it_to_stop(owner, spec):
    client = owner.client()
    job = Job.objects.unscoped().get(public_id=client.post("/api/v1/jobs", spec, format="json").json()["id"])
    job_transition(job=job, to=JobStatus.STARTING)
    job_transition(job=job, to=JobStatus.RUNNING)
    body = client.post(f"/api/v1/jobs/{job.public_id}/cancel").json()
    assert body["status"] == "cancelling"
    assert client.post(f"/api/v1/jobs/{job.public_id}/cancel").json()["status"] == "cancelling"
    assert JobEvent.objects.filter(job=job, type="job.cancelling").count() == 1


def test_estimate_validates_and_prices_without_creating(owner, spec):
    response = owner.client().post("/api/v1/jobs/estimate", spec, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"gpu_seconds", "cpu_seconds", "cost_usd", "queue_position", "can_start_now", "reason", "warnings"}
    assert body["gpu_seconds"] == 0.0
    assert body["cpu_seconds"] > 0
    assert body["cost_usd"] == "0.00"
    assert body["queue_position"] == 1
    assert body["can_start_now"] is True
    assert body["reason"] is None
    assert Job.objects.unscoped().count() == 0
    bad = owner.client().post("/api/v1/jobs/estimate", dict(spec, model="x/y"), format="json")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "model"


def test_estimate_of_a_long_real_model_run_costs_money(owner, spec):
    spec.update(model="HuggingFaceTB/SmolLM2-135M-Instruct", max_steps=2000, batch_size=64)
    body = owner.client().post("/api/v1/jobs/estimate", spec, format="json").json()
    assert body["cpu_seconds"] > 3600
    assert float(body["cost_usd"]) > 0.1


def test_estimate_says_why_a_job_would_wait(owner, spec, settings):
    settings.LAB_ORG_MAX_RUNNING_JOBS = 1
    job = Job.objects.unscoped().get(public_id=owner.client().post("/api/v1/jobs", spec, format="json").json()["id"])
    job_transition(job=job, to=JobStatus.STARTING)
    body = owner.client().post("/api/v1/jobs/estimate", spec, format="json").json()
    assert body["can_start_now"] is False
    assert body["reason"] == "org_concurrency_limit"


def test_catalogues_and_prices(owner):
    client = owner.client()
    models = client.get("/api/v1/models").json()
    assert models["object"] == "list"
    ids = {model["id"] for model in models["data"]}
    assert {"HuggingFaceTB/SmolLM2-135M-Instruct", "lab/tiny-random-llama"} <= ids
    environments = client.get("/api/v1/environments").json()["data"]
    assert {env["id"] for env in environments} == {"lab/addition", "lab/reverse-text", "lab/alphabet-sort", "lab/python-code"}
    addition = next(env for env in environments if env["id"] == "lab/addition")
    assert addition["name"] == "addition"
    assert "max_operand" in addition["args"]
    prices = {price["resource_type"]: price for price in client.get("/api/v1/prices").json()["data"]}
    assert prices["cpu"]["usd_per_hour"] == "0.10"
    assert prices["cpu"]["unit"] == "job_hour"
    assert prices["H100"]["usd_per_hour"] == "2.50"
    assert prices["H100"]["unit"] == "gpu_hour"


def test_the_job_spec_json_schema_is_public():
    from rest_framework.test import APIClient

    schema = APIClient().get("/api/v1/schema/job-spec.json").json()
    assert schema["title"] == "Lab job spec"
    assert "model" in schema["properties"]
    assert "model" in schema["required"]


def _attempt_with_files(job: Job, runs_dir) -> JobAttempt:
    """Claim an attempt of ``job`` and leave in its work dir what an engine leaves: spool, log, weights."""
    attempt = job_claim_for_start(job_id=job.pk)
    workdir = runs_dir / job.public_id / f"attempt-{attempt.number}"
    (workdir / "spool").mkdir(parents=True)
    (workdir / "spool" / "samples.jsonl").write_text('{"prompt": "1+1=", "completion": "2"}\n')
    (workdir / "stderr.log").write_text("step 1\n")
    (workdir / "weights").mkdir()
    (workdir / "weights" / "adapter_model.safetensors").write_bytes(b"\0" * 64)
    attempt.handle = {"workdir": str(workdir)}
    attempt.save(update_fields=["handle"])
    return attempt


def test_deleting_a_job_removes_its_run_directory_and_every_attempt_work_dir(
    owner, spec, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.LAB_DATA_DIR = tmp_path / "data"
    runs = tmp_path / "data" / "runs"
    earlier_runs = tmp_path / "earlier-data" / "runs"  # an attempt launched under another LAB_DATA_DIR
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    first = _attempt_with_files(job, earlier_runs)
    job_transition(job=job, to=JobStatus.QUEUED)
    second = _attempt_with_files(job, runs)
    job_transition(job=job, to=JobStatus.FAILED)
    (runs / job.public_id / "stray.txt").write_text("left by hand")
    other = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    other_attempt = _attempt_with_files(other, runs)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = owner.client().delete(f"/api/v1/jobs/{job.public_id}")
    assert response.status_code == 204
    assert len(callbacks) == 1
    assert not Path(first.handle["workdir"]).exists()
    assert not (earlier_runs / job.public_id).exists()
    assert not Path(second.handle["workdir"]).exists()
    assert not (runs / job.public_id).exists()
    assert sorted(path.name for path in runs.iterdir()) == [other.public_id]
    assert (Path(other_attempt.handle["workdir"]) / "weights" / "adapter_model.safetensors").read_bytes() == b"\0" * 64
    assert not Job.objects.unscoped().filter(pk=job.pk).exists()


def test_deleting_a_job_whose_files_are_gone_still_succeeds(
    owner, spec, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.LAB_DATA_DIR = tmp_path / "data"
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    attempt.handle = {"workdir": str(tmp_path / "data" / "runs" / job.public_id / "attempt-1")}
    attempt.save(update_fields=["handle"])
    job_transition(job=job, to=JobStatus.CANCELLED)
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.client().delete(f"/api/v1/jobs/{job.public_id}")
    assert response.status_code == 204
    assert not Job.objects.unscoped().filter(pk=job.pk).exists()


def test_deleting_a_job_leaves_a_work_dir_its_attempt_handle_points_outside_the_job(
    owner, spec, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.LAB_DATA_DIR = tmp_path / "data"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("not a work dir")
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = job_claim_for_start(job_id=job.pk)
    attempt.handle = {"workdir": str(precious)}
    attempt.save(update_fields=["handle"])
    job_transition(job=job, to=JobStatus.CANCELLED)
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.client().delete(f"/api/v1/jobs/{job.public_id}").status_code == 204
    assert (precious / "keep.txt").read_text() == "not a work dir"


def test_a_job_that_is_not_finished_keeps_its_files_when_its_delete_is_refused(
    owner, spec, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.LAB_DATA_DIR = tmp_path / "data"
    job = job_submit(project=owner.project, actor=Actor(user=owner.user), data=spec)
    attempt = _attempt_with_files(job, tmp_path / "data" / "runs")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = owner.client().delete(f"/api/v1/jobs/{job.public_id}")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "invalid_state"
    assert callbacks == []
    assert (Path(attempt.handle["workdir"]) / "stderr.log").read_text() == "step 1\n"
    assert Job.objects.unscoped().filter(pk=job.pk).exists()
