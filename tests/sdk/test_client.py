"""Tests for the SDK client against a fake Lab on a real local socket."""

import json
import sys
import uuid
from decimal import Decimal

import labsdk
import pytest
from labsdk import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InvalidSpecError,
    JobCancelledError,
    JobFailedError,
    Lab,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    WaitTimeoutError,
)
from labsdk.client import api_url
from labsdk.errors import parse_retry_after
from labsdk.types import Job

from tests.sdk.fake_lab import API_KEY, error_body
from tests.support.spec_examples import MINIMAL, PRIME_ONLY_TOML


def posts(fake_lab, path="/api/v1/jobs"):
    return [r for r in fake_lab.requests if r.method == "POST" and r.path == path]


# --- create --------------------------------------------------------------------------------

def test_it_creates_a_job_from_a_spec_dict(fake_lab, lab_client):
    job = lab_client.jobs.create(spec={**MINIMAL, "metadata": {"team": "research"}})

    assert isinstance(job, Job)
    assert job.id == "job_0001"
    assert job.status == "queued"
    assert job.spec["batch_size"] == 32
    assert job.metadata == {"team": "research"}
    [request] = posts(fake_lab)
    assert json.loads(request.body) == {**MINIMAL, "metadata": {"team": "research"}}
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.headers["content-type"] == "application/json"
    assert uuid.UUID(request.headers["idempotency-key"]).version == 4


def test_it_creates_a_job_from_a_toml_file_with_a_name_override(fake_lab, lab_client, tmp_path):
    path = tmp_path / "prime.toml"
    path.write_text(PRIME_ONLY_TOML)

    job = lab_client.jobs.create(spec_file=path, name="renamed")

    assert job.name == "renamed"
    assert len(job.warnings) == 5
    assert job.spec["wandb"] == {"project": "lab-runs", "name": "addition"}
    assert json.loads(posts(fake_lab)[0].body)["oversampling_factor"] == 1.5


def test_it_creates_a_job_from_keyword_fields(fake_lab, lab_client):
    job = lab_client.jobs.create(model="lab/tiny-random-llama", env=[{"id": "lab/addition"}], max_steps=3)

    assert job.max_steps == 3


def test_it_gives_each_create_call_its_own_idempotency_key(fake_lab, lab_client):
    lab_client.jobs.create(spec=MINIMAL)
    lab_client.jobs.create(spec=MINIMAL)

    keys = {request.headers["idempotency-key"] for request in posts(fake_lab)}
    assert len(keys) == 2
    assert len(fake_lab.jobs) == 2


def test_it_raises_invalid_spec_with_every_problem(fake_lab, lab_client):
    with pytest.raises(InvalidSpecError) as caught:
        lab_client.jobs.create(spec={"model": "m", "env": [{"id": "nope"}], "batch_size": 30})

    error = caught.value
    assert error.status_code == 400
    assert error.code == "invalid_spec"
    assert error.param == "env.0.id"
    assert [(problem.param, problem.code) for problem in error.errors] == [
        ("env.0.id", "invalid_value"), ("batch_size", "not_divisible"),
    ]
    assert fake_lab.jobs == {}


def test_it_refuses_an_unreadable_spec_file_without_calling_lab(fake_lab, lab_client, tmp_path):
    path = tmp_path / "dup.toml"
    path.write_text('model = "a"\nmodel = "b"\n')

    with pytest.raises(InvalidSpecError) as caught:
        lab_client.jobs.create(spec_file=path)

    assert [(p.param, p.code) for p in caught.value.errors] == [("", "duplicate_key")]
    assert fake_lab.requests == []


def test_it_refuses_a_spec_that_is_not_json_by_path_without_calling_lab(fake_lab, lab_client):
    with pytest.raises(InvalidSpecError) as caught:
        lab_client.jobs.create(spec={**MINIMAL, "learning_rate": float("nan"), "max_steps": 0})

    assert [(p.param, p.code) for p in caught.value.errors] == [
        ("max_steps", "out_of_range"), ("learning_rate", "invalid_value"),
    ]
    assert fake_lab.requests == []


def test_it_refuses_a_json_spec_file_that_is_not_an_object(fake_lab, lab_client, tmp_path):
    path = tmp_path / "job.json"
    path.write_text("[1, 2]")

    with pytest.raises(InvalidSpecError, match="must be a table"):
        lab_client.jobs.create(spec_file=path)


def test_it_refuses_spec_and_spec_file_together(lab_client, tmp_path):
    with pytest.raises(ValueError, match="not both"):
        lab_client.jobs.create(spec=MINIMAL, spec_file=tmp_path / "job.toml")
    with pytest.raises(ValueError, match="give spec"):
        lab_client.jobs.create()


# --- retries -------------------------------------------------------------------------------

def test_a_create_whose_answer_is_lost_is_retried_with_the_same_key_and_makes_one_job(
    fake_lab, lab_client, sleeps
):
    fake_lab.drop_next = 1

    job = lab_client.jobs.create(spec=MINIMAL)

    attempts = posts(fake_lab)
    assert len(attempts) == 2
    assert attempts[0].headers["idempotency-key"] == attempts[1].headers["idempotency-key"]
    assert attempts[0].body == attempts[1].body
    assert list(fake_lab.jobs) == [job.id]
    assert len(sleeps) == 1 and 0.25 <= sleeps[0] <= 0.5


def test_it_retries_5xx_with_backoff_then_succeeds(fake_lab, lab_client, sleeps):
    fake_lab.fail_next = [(503, {}, error_body(503, "unavailable", "Down.")), (502, {}, None)]

    identity = lab_client.whoami()

    assert identity.project.slug == "default"
    assert fake_lab.count("GET", "/api/v1/whoami") == 3
    assert 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0


def test_it_waits_as_long_as_retry_after_says_on_429(fake_lab, lab_client, sleeps):
    fake_lab.fail_next = [(429, {"Retry-After": "3"}, error_body(429, "rate_limited", "Slow down."))]

    lab_client.models.list()

    assert sleeps == [3.0]


def test_it_raises_rate_limit_at_once_when_retry_after_is_too_long(fake_lab, lab_client, sleeps):
    fake_lab.fail_next = [(429, {"Retry-After": "3600"}, error_body(429, "rate_limited", "Slow down."))]

    with pytest.raises(RateLimitError) as caught:
        lab_client.models.list()

    assert caught.value.retry_after == 3600.0
    assert caught.value.code == "rate_limited"
    assert sleeps == []


def test_it_gives_up_after_max_retries_on_5xx(fake_lab, lab_client, sleeps):
    fake_lab.fail_next = [(500, {}, error_body(500, "internal_error", "Oops."))] * 3

    with pytest.raises(APIError) as caught:
        lab_client.jobs.retrieve("job_0001")

    assert caught.value.status_code == 500
    assert caught.value.code == "internal_error"
    assert str(caught.value) == "500 internal_error: Oops."
    assert fake_lab.count("GET", "/api/v1/jobs/job_0001") == 3
    assert len(sleeps) == 2


def test_it_does_not_retry_4xx(fake_lab, lab_client, sleeps):
    with pytest.raises(NotFoundError):
        lab_client.jobs.retrieve("job_9999")

    assert fake_lab.count("GET", "/api/v1/jobs/job_9999") == 1
    assert sleeps == []


def test_it_raises_connection_error_when_lab_is_down(sleeps):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = Lab(api_key=API_KEY, base_url=f"http://127.0.0.1:{port}", max_retries=2)

    with pytest.raises(APIConnectionError, match="could not reach Lab"):
        client.models.list()
    assert len(sleeps) == 2


def test_it_reports_a_non_json_error_page(fake_lab, lab_client):
    fake_lab.fail_next = [(404, {}, "<html>gateway</html>")]

    with pytest.raises(NotFoundError, match="HTTP 404"):
        lab_client.models.list()


@pytest.mark.parametrize("status,code,error_class", [
    (400, "invalid_request", BadRequestError),
    (401, "invalid_api_key", AuthenticationError),
    (402, "insufficient_credit", PaymentRequiredError),
    (403, "insufficient_scope", PermissionDeniedError),
    (404, "not_found", NotFoundError),
    (409, "idempotency_conflict", ConflictError),
    (413, "request_too_large", RequestTooLargeError),
    (418, "teapot", APIError),
])
def test_it_maps_error_statuses_to_exceptions(fake_lab, lab_client, status, code, error_class):
    body = error_body(status, code, "Refused.", [{"param": "limit", "code": "out_of_range", "message": "1-100"}])
    fake_lab.fail_next = [(status, {}, body)]

    with pytest.raises(error_class) as caught:
        lab_client.jobs.create(spec=MINIMAL)

    assert type(caught.value) is error_class
    assert (caught.value.status_code, caught.value.code, caught.value.message) == (status, code, "Refused.")
    assert caught.value.param == "limit"
    assert caught.value.errors == [{"param": "limit", "code": "out_of_range", "message": "1-100"}]


def test_it_refuses_to_call_lab_without_an_api_key(fake_lab, monkeypatch):
    monkeypatch.delenv("LAB_API_KEY", raising=False)
    client = Lab(base_url=fake_lab.url)

    with pytest.raises(AuthenticationError, match="LAB_API_KEY"):
        client.whoami()
    assert fake_lab.requests == []


def test_a_wrong_api_key_is_an_authentication_error(fake_lab):
    with pytest.raises(AuthenticationError, match="Invalid API key"):
        Lab(api_key="lab_wrong", base_url=fake_lab.url).whoami()


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after(None) is None


# --- reading -------------------------------------------------------------------------------

def test_list_pages_by_itself_newest_first(fake_lab, lab_client):
    created = [fake_lab.add_job()["id"] for _ in range(45)]

    listed = [job.id for job in lab_client.jobs.list(limit=20)]

    assert listed == list(reversed(created))
    pages = [r for r in fake_lab.requests if r.path == "/api/v1/jobs"]
    assert [r.query.get("after") for r in pages] == [None, [created[25]], [created[5]]]
    assert all(r.query["limit"] == ["20"] for r in pages)


def test_list_fetches_pages_only_as_iteration_needs_them(fake_lab, lab_client):
    for _ in range(5):
        fake_lab.add_job()

    first = next(lab_client.jobs.list(limit=2))

    assert first.id == "job_0005"
    assert fake_lab.count("GET", "/api/v1/jobs") == 1


def test_list_filters_by_status_and_metadata(fake_lab, lab_client):
    fake_lab.add_job(metadata={"team": "research"})
    wanted = fake_lab.add_job(status="running", metadata={"team": "research"})
    fake_lab.add_job(status="running", metadata={"team": "ops"})

    found = list(lab_client.jobs.list(status="running", metadata={"team": "research"}))

    assert [job.id for job in found] == [wanted["id"]]
    [request] = [r for r in fake_lab.requests if r.path == "/api/v1/jobs"]
    assert request.query["metadata[team]"] == ["research"] and request.query["status"] == ["running"]


def test_retrieve_reads_every_documented_field(fake_lab, lab_client):
    fake_lab.add_job(
        status="failed", error={"code": "oom", "message": "Out of memory."},
        usage={"gpu_seconds": 12.5, "cpu_seconds": 3, "cost_usd": "1.25"},
        latest_checkpoint={
            "id": "ckpt_1", "job_id": "job_0001", "step": 5, "attempt": 1, "status": "ready",
            "format": "peft-lora", "size_bytes": 10, "sha256": "ab", "created_at": "2026-11-29T22:16:31Z",
        },
        new_field_from_a_newer_server=True,
    )

    job = lab_client.jobs.retrieve("job_0001")

    assert job.error.code == "oom"
    assert job.usage.cost_usd == Decimal("1.25")
    assert job.latest_checkpoint.status == "ready"
    assert job.created_at.isoformat() == "2026-11-29T22:01:00+00:00"
    assert job.is_terminal
    assert job.new_field_from_a_newer_server is True
    assert job.to_dict()["usage"]["cost_usd"] == "1.25"


def test_ids_cannot_change_the_request_path(fake_lab, lab_client):
    with pytest.raises(NotFoundError):
        lab_client.jobs.retrieve("../whoami")

    assert fake_lab.requests[-1].path == "/api/v1/jobs/..%2Fwhoami"


def test_cancel_a_queued_job_and_refuse_a_finished_one(fake_lab, lab_client):
    queued = fake_lab.add_job()
    finished = fake_lab.add_job(status="succeeded")

    assert lab_client.jobs.cancel(queued["id"]).status == "cancelled"
    with pytest.raises(ConflictError) as caught:
        lab_client.jobs.cancel(finished["id"])
    assert caught.value.code == "invalid_state"
    assert fake_lab.jobs[finished["id"]]["status"] == "succeeded"


def test_events_are_typed(fake_lab, lab_client):
    job = fake_lab.add_job()

    [event] = list(lab_client.jobs.events(job["id"]))

    assert (event.type, event.level, event.message) == ("job.queued", "info", "Job queued.")


def test_estimate_validates_and_prices_a_spec(fake_lab, lab_client, tmp_path):
    path = tmp_path / "prime.toml"
    path.write_text(PRIME_ONLY_TOML)

    estimate = lab_client.jobs.estimate(spec_file=path)

    assert estimate.cost_usd == Decimal("0.01")
    assert estimate.can_start_now is True
    assert len(estimate.warnings) == 5
    assert posts(fake_lab, "/api/v1/jobs/estimate")
    assert fake_lab.jobs == {}


def test_catalogues_prices_and_whoami_are_typed(fake_lab, lab_client):
    models = lab_client.models.list()
    environments = lab_client.environments.list()
    prices = lab_client.prices.list()
    identity = lab_client.whoami()

    assert [(m.id, m.context_length) for m in models] == [
        ("lab/tiny-random-llama", 512), ("HuggingFaceTB/SmolLM2-135M-Instruct", 8192)
    ]
    assert models[1].quantized_source == "gguf"
    assert environments[0].args == {"min_operand": 0, "max_operand": 20, "num_operands": 2}
    assert [(p.resource_type, p.usd_per_hour) for p in prices] == [("cpu", Decimal("0.10")), ("H100", Decimal("2.50"))]
    assert (identity.organization.slug, identity.scopes) == ("acme", ["read", "write"])


# --- wait ----------------------------------------------------------------------------------

def test_wait_returns_the_succeeded_job_and_shows_progress(fake_lab, lab_client, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # tqdm draws its bar on a terminal only
    job = fake_lab.add_job(max_steps=20)
    fake_lab.timelines[job["id"]] = [
        {"status": "running", "step": 5, "reward": 0.125},
        {"status": "running", "step": 12, "reward": 0.25},
        {"status": "succeeded", "step": 20, "reward": 0.375},
    ]

    finished = lab_client.jobs.wait(job["id"], poll_interval=0.01)

    assert finished.status == "succeeded"
    assert finished.step == 20
    progress = capsys.readouterr().err
    assert "20/20" in progress
    assert "reward/mean=0.375" in progress
    metric_reads = [r for r in fake_lab.requests if r.path.endswith("/metrics")]
    assert [r.query.get("after_step") for r in metric_reads] == [None, ["5"], ["12"]]
    assert metric_reads[0].query["names"] == ["reward/mean"]


def test_wait_without_progress_reads_no_metrics(fake_lab, lab_client, capsys):
    job = fake_lab.add_job()
    fake_lab.timelines[job["id"]] = [{"status": "succeeded", "step": 20}]

    lab_client.jobs.wait(job["id"], progress=False)

    assert capsys.readouterr().err == ""
    assert not [r for r in fake_lab.requests if r.path.endswith("/metrics")]


def test_wait_raises_job_failed_with_the_job(fake_lab, lab_client):
    job = fake_lab.add_job()
    fake_lab.timelines[job["id"]] = [
        {"status": "failed", "error": {"code": "heartbeat_lost", "message": "No heartbeat for 60 s."}}
    ]

    with pytest.raises(JobFailedError) as caught:
        lab_client.jobs.wait(job["id"], progress=False)

    assert caught.value.job.error.code == "heartbeat_lost"
    assert str(caught.value) == f"job {job['id']} failed (heartbeat_lost: No heartbeat for 60 s.)"


def test_wait_raises_job_cancelled_with_the_job(fake_lab, lab_client):
    job = fake_lab.add_job()
    fake_lab.timelines[job["id"]] = [{"status": "cancelling"}, {"status": "cancelled"}]

    with pytest.raises(JobCancelledError) as caught:
        lab_client.jobs.wait(job["id"], progress=False)

    assert caught.value.job.status == "cancelled"


def test_wait_times_out_with_the_last_job_seen(fake_lab, lab_client):
    job = fake_lab.add_job()

    with pytest.raises(WaitTimeoutError) as caught:
        lab_client.jobs.wait(job["id"], timeout=0, progress=False)

    assert caught.value.job.status == "queued"
    assert caught.value.timeout == 0


# --- configuration -------------------------------------------------------------------------

def test_the_module_level_client_reads_the_environment(lab_env):
    import labsdk as lab

    job = lab.jobs.create(spec=MINIMAL)

    assert lab.jobs.retrieve(job.id).id == job.id
    assert lab.whoami().project.slug == "default"
    assert labsdk.default_client().base_url == lab_env.url


def test_the_module_level_adapters_billing_and_usage_are_the_default_clients(lab_env):
    # lab.adapters.list(...) as the docs write it reaches the client's resource (no submodule
    # of labsdk may take these names: they were once modules and shadowed the resources).
    import labsdk as lab
    from labsdk._adapters import Adapters
    from labsdk._billing import Billing

    assert isinstance(lab.adapters, Adapters) and lab.adapters is labsdk.default_client().adapters
    assert isinstance(lab.billing, Billing) and lab.billing is labsdk.default_client().billing
    assert lab.usage == labsdk.default_client().usage


def test_lab_reads_its_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("LAB_API_KEY", "lab_env_key")
    monkeypatch.setenv("LAB_BASE_URL", "https://lab.example.com/")

    client = Lab()

    assert (client.api_key, client.base_url) == ("lab_env_key", "https://lab.example.com")
    assert Lab(api_key="lab_given", base_url="http://other:1").api_key == "lab_given"


def test_api_url_accepts_an_address_with_or_without_the_prefix():
    assert api_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/api/v1"
    assert api_url("http://127.0.0.1:8000/api/v1/") == "http://127.0.0.1:8000/api/v1"


def test_the_http_layer_serves_other_callers_with_their_own_token(fake_lab):
    from labsdk._http import HTTPClient

    with HTTPClient(base_url=fake_lab.url + "/api/v1", token=API_KEY) as http:
        assert http.request("GET", "whoami")["scopes"] == ["read", "write"]
    anonymous = HTTPClient(base_url=fake_lab.url, token=None, missing_token_message="LAB_JOB_TOKEN is not set")
    with pytest.raises(AuthenticationError, match="LAB_JOB_TOKEN is not set"):
        anonymous.request("POST", "api/v1/ingest/jobs/job_1/status", json_body={})


def test_wait_shows_steps_only_when_lab_has_no_metrics_endpoint(fake_lab, lab_client, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # tqdm draws its bar on a terminal only
    job = fake_lab.add_job(max_steps=4)
    fake_lab.timelines[job["id"]] = [{"status": "running", "step": 2}, {"status": "succeeded", "step": 4}]
    fake_lab.metrics.pop(job["id"])
    original_route = fake_lab.route
    fake_lab.route = lambda method, path, query, body: (
        (404, {}, error_body(404, "not_found", "No route.")) if path.endswith("/metrics")
        else original_route(method, path, query, body)
    )

    assert lab_client.jobs.wait(job["id"]).status == "succeeded"

    assert "4/4" in capsys.readouterr().err
    assert len([r for r in fake_lab.requests if r.path.endswith("/metrics")]) == 1


# --- more of the jobs API, checkpoints -----------------------------------------------------

def test_restart_a_failed_job_and_refuse_a_running_one(fake_lab, lab_client):
    failed = fake_lab.add_job(status="failed", error={"code": "oom", "message": "Out of memory."})
    running = fake_lab.add_job(status="running")

    restarted = lab_client.jobs.restart(failed["id"])

    assert (restarted.status, restarted.attempt, restarted.error) == ("queued", 1, None)  # attempt 2 counts at start
    with pytest.raises(ConflictError):
        lab_client.jobs.restart(running["id"])
    assert fake_lab.jobs[running["id"]]["status"] == "running"


def test_delete_a_finished_job_and_refuse_a_running_one(fake_lab, lab_client):
    finished = fake_lab.add_job(status="succeeded")
    running = fake_lab.add_job(status="running")

    assert lab_client.jobs.delete(finished["id"]) is None
    with pytest.raises(ConflictError):
        lab_client.jobs.delete(running["id"])
    assert list(fake_lab.jobs) == [running["id"]]


def test_logs_page_by_sequence_number(fake_lab, lab_client):
    job = fake_lab.add_job()
    fake_lab.logs[job["id"]] = [
        {"seq": seq, "time": "2026-11-29T22:16:31Z", "attempt": 1, "stream": "stdout", "line": f"line {seq}"}
        for seq in range(1, 6)
    ]

    lines = list(lab_client.jobs.logs(job["id"], after=1, limit=2))

    assert [line.line for line in lines] == ["line 2", "line 3", "line 4", "line 5"]
    reads = [r.query.get("after") for r in fake_lab.requests if r.path.endswith("/logs")]
    assert reads == [["1"], ["3"]]


def test_samples_of_one_step(fake_lab, lab_client):
    job = fake_lab.add_job()
    fake_lab.samples[job["id"]] = [
        {"step": step, "group": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0, "advantage": 0.5,
         "metrics": {"correct": 1}}
        for step in (1, 2)
    ]

    [sample] = lab_client.jobs.samples(job["id"], step=2)

    assert (sample.step, sample.completion, sample.advantage, sample.metrics) == (2, "2", 0.5, {"correct": 1})


def test_checkpoints_are_listed_and_downloaded(fake_lab, lab_client, tmp_path):
    job = fake_lab.add_job()
    fake_lab.checkpoints[job["id"]] = [{"id": "ckpt_1", "job_id": job["id"], "step": 5, "status": "ready",
                                        "format": "peft-lora", "size_bytes": 3, "sha256": "x"}]
    fake_lab.archives["ckpt_1"] = b"tar" * 100_000

    [checkpoint] = list(lab_client.jobs.checkpoints(job["id"]))
    saved = lab_client.checkpoints.download(checkpoint.id, tmp_path / "ckpt.tar", extract=False, progress=False)

    assert saved == tmp_path / "ckpt.tar"
    assert saved.read_bytes() == b"tar" * 100_000


def test_a_redirected_download_never_sends_the_api_key_to_storage(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = b"archive"
    fake_lab.redirect_downloads = True

    saved = lab_client.checkpoints.download("ckpt_1", tmp_path / "ckpt.tar", extract=False, progress=False)

    assert saved.read_bytes() == b"archive"
    [storage_request] = [r for r in fake_lab.requests if r.path.startswith("/signed/")]
    assert "authorization" not in storage_request.headers
    assert storage_request.query == {"signature": ["abc"]}


def test_a_failed_download_leaves_no_file(fake_lab, lab_client, tmp_path):
    fake_lab.archives["ckpt_1"] = b"archive"
    fake_lab.truncate_downloads = True

    with pytest.raises(APIConnectionError, match="broke off"):
        lab_client.checkpoints.download("ckpt_1", tmp_path / "ckpt.tar", extract=False, progress=False)
    with pytest.raises(NotFoundError):
        lab_client.checkpoints.download("ckpt_2", tmp_path / "other.tar", extract=False, progress=False)

    assert list(tmp_path.iterdir()) == []


# --- live stream ---------------------------------------------------------------------------

def stream_events(job):
    return [
        {"id": 1, "event": "status", "data": {**job, "status": "running"}},
        {"id": 2, "event": "metrics", "data": {"step": 1, "time": "2026-11-29T22:30:00Z", "attempt": 1,
                                               "values": {"reward/mean": 0.25}}},
        {"id": 3, "event": "log", "data": {"seq": 1, "time": None, "attempt": 1, "stream": "stdout",
                                           "line": "multi\nline"}},
        {"id": 4, "event": "future", "data": {"anything": [1]}},
        {"id": 5, "event": "status", "data": {**job, "status": "succeeded", "step": 20}},
    ]


def test_stream_yields_typed_events_until_the_job_finishes(fake_lab, lab_client):
    job = fake_lab.add_job()
    fake_lab.streams[job["id"]] = stream_events(job)

    events = list(lab_client.jobs.stream(job["id"]))

    assert [(e.event, e.id) for e in events] == [
        ("status", None), ("status", "1"), ("metrics", "2"), ("log", "3"), ("future", "4"), ("status", "5"),
    ]
    assert events[2].data.values == {"reward/mean": 0.25}
    assert events[3].data.line == "multi\nline"
    assert events[4].data == {"anything": [1]}
    assert events[5].data.status == "succeeded"
    [request] = [r for r in fake_lab.requests if r.path.endswith("/stream")]
    assert request.headers["accept"] == "text/event-stream"


def test_a_broken_stream_resumes_after_the_last_event_id(fake_lab, lab_client, sleeps):
    job = fake_lab.add_job()
    fake_lab.streams[job["id"]] = stream_events(job)
    fake_lab.cut_next_stream_after = 2

    events = list(lab_client.jobs.stream(job["id"]))

    assert [e.id for e in events] == [None, "1", "2", None, "3", "4", "5"]
    connections = [r for r in fake_lab.requests if r.path.endswith("/stream")]
    assert [r.headers.get("last-event-id") for r in connections] == [None, "2"]
    assert len(sleeps) == 1


def test_a_stream_that_keeps_ending_early_gives_up(fake_lab, lab_client, sleeps):
    job = fake_lab.add_job(status="running")

    with pytest.raises(APIConnectionError, match="ended before the job finished"):
        list(lab_client.jobs.stream(job["id"], from_now=True))

    # it kept reconnecting for the client's stream_reconnect_s (60 s of pauses, each at most 4 s)
    connections = [r for r in fake_lab.requests if r.path.endswith("/stream")]
    assert len(connections) == len(sleeps) + 1
    assert sum(sleeps) == pytest.approx(60.0)
    assert max(sleeps) <= 4.0
    assert connections[0].query == {"from": ["now"]}


def test_a_stream_without_reconnection_time_gives_up_at_the_first_break(fake_lab, lab_client, sleeps):
    job = fake_lab.add_job(status="running")

    with pytest.raises(APIConnectionError, match="ended before the job finished"):
        list(lab_client.jobs.stream(job["id"], reconnect_s=0))

    assert len([r for r in fake_lab.requests if r.path.endswith("/stream")]) == 1
    assert sleeps == []


def test_it_creates_a_job_from_a_spec_model(fake_lab, lab_client):
    from labsdk.spec import JobSpec, parse_spec

    spec = JobSpec(model="lab/tiny-random-llama", env=[{"id": "lab/addition"}], max_steps=4)

    assert lab_client.jobs.create(spec).max_steps == 4
    assert lab_client.jobs.create(parse_spec(MINIMAL), name="from-parsed").name == "from-parsed"
    assert json.loads(posts(fake_lab)[0].body)["max_steps"] == 4


def test_it_names_a_web_page_answer_instead_of_dumping_it(fake_lab, lab_client):
    fake_lab.fail_next = [(404, {}, "<!DOCTYPE html>\n<html><head><title>Page not found</title>")]

    with pytest.raises(NotFoundError) as caught:
        lab_client.models.list()

    assert caught.value.message == "HTTP 404: the answer is a web page, not Lab's API (is LAB_BASE_URL right?)"
