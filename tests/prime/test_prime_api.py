"""Lab's Prime-compatible API (/prime/api/v1, jobs.api.prime) through Django's test client: the
shapes prime CLI 0.18.0 reads, bad input, scopes, rate limits and other organizations' runs."""

from __future__ import annotations

import tomllib
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import UsageInterval
from jobs.api.prime.serializers import RUN_TOKEN_PLACEHOLDER
from jobs.models import Checkpoint, CheckpointStatus, Job, JobStatus, LogLine, MetricStep, RolloutSample
from jobs.secrets.models import JobSecrets
from jobs.services import job_transition
from lab.audit import Actor
from lab.services import api_key_create
from tests.support.prime_configs import BAD_RL_TOML, tiny_config

pytestmark = pytest.mark.django_db

BASE = "/prime/api/v1"

RUN_KEYS = {
    "id", "name", "userId", "status", "baseModel", "environments", "maxSteps", "batchSize",
    "rolloutsPerExample", "maxTokens", "learningRate", "loraAlpha", "gpuCount", "runsAhead",
    "queueReason", "startedAt", "completedAt", "errorMessage", "failureAnalysis", "createdAt", "updatedAt",
}


def submit(tenant, key: str | None = None, **body) -> Job:
    response = tenant.client(key).post(f"{BASE}/training/runs", {"config": tiny_config(), **body}, format="json")
    assert response.status_code == 200, response.content
    return Job.objects.unscoped().get(public_id=response.json()["runId"])


def test_it_submits_prime_rls_layout_as_a_lab_job_and_answers_no_credential(owner):
    response = owner.client().post(
        f"{BASE}/training/runs",
        {"config": tiny_config(), "name": "ignored-when-the-config-names-it", "gpuType": "cpu",
         "wandbApiKey": "wandb-secret", "imageTag": "main", "teamId": "team_1"},
        format="json",
    )

    assert response.status_code == 200, response.content
    job = Job.objects.unscoped().get()
    assert response.json() == {"runId": job.public_id, "tokenValue": RUN_TOKEN_PLACEHOLDER, "gpuType": "cpu"}
    assert job.public_id.startswith("job_") and job.status == JobStatus.QUEUED
    assert (job.name, job.model, job.spec["batch_size"], job.spec["rollouts_per_example"]) == (
        "prime-tiny", "lab/tiny-random-llama", 8, 4,
    )
    assert (job.spec["lora_rank"], job.spec["learning_rate"], job.spec["env"][0]["id"]) == (4, 0.01, "lab/addition")
    assert job.spec["translated_from"] == {"layout": "prime-rl", "config": tiny_config() | {"gpu_type": "cpu"}}
    assert JobSecrets.objects.get(job=job).names == ["WANDB_API_KEY"]
    assert owner.key not in response.content.decode()


def test_the_body_name_names_a_config_without_one(owner):
    config = tiny_config()
    del config["name"]

    response = owner.client().post(f"{BASE}/training/runs", {"config": config, "name": "from-the-flag"}, format="json")

    assert response.status_code == 200, response.content
    assert Job.objects.unscoped().get().name == "from-the-flag"


def test_a_refused_spec_is_a_422_listing_every_problem_and_creates_nothing(owner):
    response = owner.client().post(f"{BASE}/training/runs", {"config": tomllib.loads(BAD_RL_TOML)}, format="json")

    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [(item["loc"], item["type"]) for item in detail] == [
        (["body", "sampling", "temperature"], "out_of_range"),
        (["body", "batch_size"], "not_divisible"),
        (["body", "env", 0, "id"], "unknown_environment"),
    ]
    assert "lab/addition" in detail[2]["msg"]
    assert not Job.objects.unscoped().exists()


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ([1, 2], []),
        ({"config": "rl.toml"}, ["config"]),
        ({"config": {}, "volume": "research"}, ["volume"]),
        ({"config": {}, "sourceRef": "main"}, ["sourceRef"]),
        ({"config": {}, "resumeFrom": "job_x"}, ["resumeFrom"]),
        ({"config": {}, "mode": "sft"}, ["mode"]),
        ({"config": {}, "name": 7}, ["name"]),
        ({"config": {}, "name": "n" * 129}, ["name"]),
        ({"config": {}, "wandbApiKey": ["x"]}, ["wandbApiKey"]),
        ({"config": {}, "colour": "blue"}, ["colour"]),
    ],
    ids=["not-an-object", "config-not-an-object", "volume", "source-ref", "resume-from", "sft", "name-type",
         "name-length", "token-type", "unknown-key"],
)
def test_it_refuses_bad_run_bodies_naming_the_key_and_creates_nothing(owner, body, loc):
    response = owner.client().post(f"{BASE}/training/runs", body, format="json")

    assert response.status_code == 422, response.content
    assert response.json()["detail"][0]["loc"] == ["body", *loc]
    assert not Job.objects.unscoped().exists()


def test_malformed_json_is_a_400_detail(owner):
    response = owner.client().post(f"{BASE}/training/runs", "{not json", content_type="application/json")

    assert response.status_code == 400
    assert response.json()["detail"].startswith("Malformed request body")


def test_prepare_is_a_404_so_the_cli_skips_local_validation(owner, read_key):
    for key in (owner.key, read_key):
        response = owner.client(key).post(f"{BASE}/training/runs/prepare", {"mode": "rl"}, format="json")
        assert response.status_code == 404
        assert "validates the config on submission" in response.json()["detail"]


@pytest.fixture
def read_key(owner) -> str:
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    return key


def test_a_run_follows_its_jobs_status_in_prime_terms(owner):
    job = submit(owner)
    client = owner.client()
    seen = [client.get(f"{BASE}/rft/runs/{job.public_id}").json()["run"]]
    for status in (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.SUCCEEDED):
        job_transition(job=job, to=status)
        seen.append(client.get(f"{BASE}/rft/runs/{job.public_id}").json()["run"])

    assert [run["status"] for run in seen] == ["QUEUED", "PENDING", "RUNNING", "COMPLETED"]
    queued, running, done = seen[0], seen[2], seen[3]
    assert set(queued) == RUN_KEYS
    assert (queued["id"], queued["userId"], queued["runsAhead"], queued["queueReason"]) == (
        job.public_id, owner.api_key.public_id, 0, "waiting",
    )
    assert (queued["baseModel"], queued["environments"], queued["maxSteps"], queued["maxTokens"]) == (
        "lab/tiny-random-llama", [{"id": "lab/addition", "name": "lab/addition"}], 2, 6,
    )
    assert queued["startedAt"] is None and running["startedAt"] is not None and running["runsAhead"] is None
    assert done["completedAt"] is not None and done["updatedAt"] == done["completedAt"]


def test_a_failed_run_carries_lab_s_error(owner):
    job = submit(owner)
    job_transition(job=job, to=JobStatus.FAILED, error_code="oom", error_message="out of memory at step 1")

    run = owner.client().get(f"{BASE}/rft/runs/{job.public_id}").json()["run"]

    assert (run["status"], run["errorMessage"]) == ("FAILED", "oom: out of memory at step 1")


def test_the_list_pages_newest_first_and_mine_keeps_this_keys_runs(owner, read_key):
    first, second, third = submit(owner), submit(owner), submit(owner)
    _, other_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="other")
    mine = submit(owner, key=other_key)
    client = owner.client(read_key)

    page_one = client.get(f"{BASE}/rft/runs", {"page": 1, "limit": 3}).json()
    page_two = client.get(f"{BASE}/rft/runs", {"page": 2, "limit": 3}).json()
    only_mine = owner.client(other_key).get(f"{BASE}/rft/runs", {"mine": "true", "team_id": "ignored"}).json()

    assert [run["id"] for run in page_one["runs"]] == [mine.public_id, third.public_id, second.public_id]
    assert [run["id"] for run in page_two["runs"]] == [first.public_id]
    assert {key: page_one[key] for key in ("total", "page", "limit", "total_pages")} == {
        "total": 4, "page": 1, "limit": 3, "total_pages": 2,
    }
    assert [run["id"] for run in only_mine["runs"]] == [mine.public_id] and only_mine["total"] == 1


@pytest.mark.parametrize("query", [{"page": "0"}, {"limit": "101"}, {"limit": "x"}])
def test_bad_list_pages_are_a_400_detail(owner, query):
    response = owner.client().get(f"{BASE}/rft/runs", query)

    assert response.status_code == 400
    assert isinstance(response.json()["detail"], str)


@pytest.fixture
def job_with_data(owner) -> Job:
    """A succeeded job with two metric steps, three samples of step 2, logs, two checkpoints and usage."""
    job = submit(owner)
    job_transition(job=job, to=JobStatus.STARTING)
    job_transition(job=job, to=JobStatus.RUNNING)
    now = timezone.now()
    Job.objects.unscoped().filter(pk=job.pk).update(step=2)
    MetricStep.objects.create(job=job, step=1, attempt=1, time=now - timedelta(seconds=5), values={"reward/mean": 0.25})
    MetricStep.objects.create(job=job, step=2, attempt=1, time=now, values={"reward/mean": 0.5, "loss/mean": 1.5})
    for group, (reward, advantage) in enumerate([(0.0, -0.5), (0.5, 0.0), (1.0, 0.5)]):
        RolloutSample.objects.create(
            job=job, step=2, attempt=1, group=group, prompt=f"p{group}", completion="c",
            reward=reward, advantage=advantage, metrics={},
        )
    for seq, (age, line) in enumerate([(7200, "loading model"), (30, "step 1 reward 0.25"), (1, "step 2 reward 0.5")]):
        LogLine.objects.create(job=job, attempt=1, source="engine", source_seq=seq, time=now - timedelta(seconds=age),
                               stream="stdout", line=line)
    Checkpoint.objects.create(job=job, step=1, attempt=1, format="peft-lora", status=CheckpointStatus.FAILED)
    Checkpoint.objects.create(job=job, step=2, attempt=1, format="peft-lora", status=CheckpointStatus.READY,
                              size_bytes=2048, ready_at=now)
    for index, (gpu_seconds, cost) in enumerate([(Decimal("0"), 1_250_000), (Decimal("0"), 250_000)]):
        UsageInterval.objects.create(
            organization=owner.organization, project=owner.project, job_public_id=job.public_id,
            attempt_id=1, attempt_number=1, index=index, resource_type="cpu", units=1,
            started_at=now, ended_at=now + timedelta(milliseconds=index),
            gpu_seconds=gpu_seconds, cpu_seconds=Decimal("30"), usd_per_hour=Decimal("0.1"), cost_micro_usd=cost,
        )
    return job_transition(job=job, to=JobStatus.SUCCEEDED)


def test_metrics_keep_the_asked_steps_with_their_values(owner, job_with_data):
    url = f"{BASE}/rft/runs/{job_with_data.public_id}/metrics"
    client = owner.client()

    everything = client.get(url).json()["metrics"]
    second = client.get(url, {"min_step": 2}).json()["metrics"]
    first = client.get(url, {"max_step": 1}).json()["metrics"]
    one = client.get(url, {"limit": 1}).json()["metrics"]

    assert [(point["step"], point["reward/mean"]) for point in everything] == [(1, 0.25), (2, 0.5)]
    assert second[0]["loss/mean"] == 1.5 and [point["step"] for point in second] == [2]
    assert [point["step"] for point in first] == [1] == [point["step"] for point in one]


def test_rollouts_page_through_one_step(owner, job_with_data):
    url = f"{BASE}/rft/runs/{job_with_data.public_id}/samples"

    page = owner.client().get(url, {"step": 2, "page": 2, "limit": 2}).json()
    latest = owner.client().get(url).json()
    empty = owner.client().get(url, {"step": 1}).json()

    assert {key: page[key] for key in ("run_id", "total", "page", "limit", "total_pages")} == {
        "run_id": job_with_data.public_id, "total": 3, "page": 2, "limit": 2, "total_pages": 2,
    }
    assert [(sample["prompt"], sample["reward"], sample["advantage"]) for sample in page["samples"]] == [("p2", 1.0, 0.5)]
    assert [sample["prompt"] for sample in latest["samples"]] == ["p0", "p1", "p2"]
    assert (empty["samples"], empty["total"], empty["total_pages"]) == ([], 0, 0)


def test_progress_names_the_steps_with_samples(owner, job_with_data):
    progress = owner.client().get(f"{BASE}/rft/runs/{job_with_data.public_id}/progress").json()
    latest_metric = MetricStep.objects.get(job=job_with_data, step=2).time

    assert progress == {
        "latestStep": 2, "stepsWithSamples": [2], "stepsWithDistributions": [2],
        "lastUpdatedAt": latest_metric.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def test_distributions_are_labs_histograms_of_a_steps_rewards_or_advantages(owner, job_with_data):
    url = f"{BASE}/rft/runs/{job_with_data.public_id}/distributions"

    rewards = owner.client().get(url).json()
    advantages = owner.client().get(url, {"type": "advantages", "step": 2}).json()
    nothing = owner.client().get(url, {"step": 1}).json()
    bad_type = owner.client().get(url, {"type": "losses"})
    bad_step = owner.client().get(url, {"step": "-1"})

    assert (rewards["step"], rewards["type"], rewards["count"], rewards["mean"]) == (2, "reward", 3, 0.5)
    assert [item["count"] for item in rewards["bins"]] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    assert (rewards["bins"][0], rewards["bins"][-1]) == (
        {"min": 0.0, "max": pytest.approx(0.1), "count": 1}, {"min": pytest.approx(0.9), "max": 1.0, "count": 1},
    )
    assert (advantages["type"], advantages["bins"][0]["min"], advantages["bins"][-1]["max"]) == ("advantage", -0.5, 0.5)
    assert nothing == {"bins": [], "step": 1, "type": "reward", "count": 0, "mean": None}
    assert bad_type.status_code == 400 and "reward, advantage" in bad_type.json()["detail"]
    assert bad_step.status_code == 400 and bad_step.json()["detail"].startswith("step must be an integer")


def test_a_distribution_of_equal_values_is_one_bin(owner):
    job = submit(owner)
    for group in range(4):
        RolloutSample.objects.create(job=job, step=3, attempt=1, group=group, prompt="p", completion="c",
                                     reward=0.5, advantage=0.0, metrics={})

    body = owner.client().get(f"{BASE}/rft/runs/{job.public_id}/distributions").json()

    assert (body["step"], body["bins"]) == (3, [{"min": 0.5, "max": 0.5, "count": 4}])


def test_checkpoints_are_listed_with_their_download_url_and_filtered_by_status(owner, job_with_data):
    url = f"{BASE}/rft/runs/{job_with_data.public_id}/checkpoints"

    listed = owner.client().get(url).json()["checkpoints"]
    ready = owner.client().get(url, {"status_filter": "ready"}).json()["checkpoints"]
    bad = owner.client().get(url, {"status_filter": "LOST"})

    assert [(item["step"], item["status"]) for item in listed] == [(2, "READY"), (1, "FAILED")]
    checkpoint = Checkpoint.objects.get(job=job_with_data, step=2)
    assert ready == [{
        "id": checkpoint.public_id, "rftRunId": job_with_data.public_id, "step": 2,
        "storageUrl": f"http://testserver/api/v1/checkpoints/{checkpoint.public_id}/download",
        "status": "READY", "sizeBytes": 2048, "createdAt": listed[0]["createdAt"], "uploadedAt": listed[0]["uploadedAt"],
    }]
    assert bad.status_code == 400 and "READY" in bad.json()["detail"]


def test_logs_are_the_tail_as_text_searchable_and_recent(owner, job_with_data):
    url = f"{BASE}/rft/runs/{job_with_data.public_id}/logs"
    client = owner.client()

    everything = client.get(url).json()["logs"].splitlines()
    last = client.get(url, {"tail_lines": 1}).json()["logs"]
    found = client.get(url, {"search": "reward"}).json()["logs"].splitlines()
    recent = client.get(url, {"since_seconds": 600}).json()["logs"].splitlines()

    assert [line.split(" ", 1)[1] for line in everything] == ["loading model", "step 1 reward 0.25", "step 2 reward 0.5"]
    assert everything[0].split(" ", 1)[0].endswith("Z")
    assert last.endswith(" step 2 reward 0.5\n") and last.count("\n") == 1
    assert [line.split(" ", 1)[1] for line in found] == ["step 1 reward 0.25", "step 2 reward 0.5"] == [
        line.split(" ", 1)[1] for line in recent
    ]


@pytest.mark.parametrize(
    "query",
    [{"component": "trainer"}, {"level": "ERROR"}, {"regex": "true"}, {"tail_lines": "0"}, {"tail_lines": "5001"},
     {"since_seconds": "86401"}, {"search": "x" * 257}],
)
def test_log_queries_lab_cannot_answer_are_a_400(owner, job_with_data, query):
    response = owner.client().get(f"{BASE}/rft/runs/{job_with_data.public_id}/logs", query)

    assert response.status_code == 400
    assert isinstance(response.json()["detail"], str)


def test_logs_of_a_queued_run_are_a_404_that_says_it_is_queued(owner):
    job = submit(owner)

    response = owner.client().get(f"{BASE}/rft/runs/{job.public_id}/logs")

    assert response.status_code == 404
    assert response.json() == {"detail": "Logs are not available yet: the job is queued."}


def test_usage_is_the_jobs_ledger_in_prime_s_shape(owner, job_with_data):
    usage = owner.client().get(f"{BASE}/billing/runs/{job_with_data.public_id}/usage").json()

    assert usage == {
        "run_id": job_with_data.public_id, "run_name": "prime-tiny", "base_model": "lab/tiny-random-llama",
        "status": "COMPLETED",
        "training": {"tokens": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 1.5},
        "inference": {"tokens": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        "total_tokens": 0, "total_cost_usd": 1.5,
        "pricing": {"training_per_mtok": None, "inference_input_per_mtok": None, "inference_output_per_mtok": None},
        "record_count": 2, "gpu_seconds": 0.0, "cpu_seconds": 60.0,
    }


def test_models_and_gpu_types_come_from_the_catalogue_and_the_pool(owner, settings):
    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 2}, {"gpu_type": "cpu", "gpus": 0}]}

    models = owner.client().get(f"{BASE}/training/available-fft-models").json()
    gpus = owner.client().get(f"{BASE}/training/available-gpu-types", {"team_id": "x"}).json()

    names = [model["name"] for model in models["models"]]
    assert "lab/tiny-random-llama" in names and names == sorted(names)
    assert [cluster["gpuType"] for cluster in models["models"][0]["clusters"]] == ["H100", "cpu"]
    assert gpus == {"gpuTypes": ["H100", "cpu"]}


def test_stop_restart_and_delete_change_the_job(owner):
    job = submit(owner)
    client = owner.client()
    url = f"{BASE}/rft/runs/{job.public_id}"

    stopped = client.put(f"{url}/stop")
    restarted = client.put(f"{url}/restart")
    busy_delete = client.delete(url)
    stopped_again = client.put(f"{url}/stop")
    deleted = client.delete(url)

    assert stopped.json()["run"]["status"] == "STOPPED"
    assert restarted.json()["run"]["status"] == "QUEUED"
    assert busy_delete.status_code == 409
    assert stopped_again.json()["run"]["status"] == "STOPPED"
    assert deleted.status_code == 204 and deleted.content == b""
    assert not Job.objects.unscoped().filter(pk=job.pk).exists()


def test_a_running_job_cannot_be_deleted_and_a_finished_one_cannot_be_stopped(owner):
    job = submit(owner)
    job_transition(job=job, to=JobStatus.STARTING)
    url = f"{BASE}/rft/runs/{job.public_id}"

    refused_delete = owner.client().delete(url)
    refused_restart = owner.client().put(f"{url}/restart")
    job_transition(job=job, to=JobStatus.FAILED)
    refused_stop = owner.client().put(f"{url}/stop")

    assert refused_delete.status_code == 409 and "Cancel it first" in refused_delete.json()["detail"]
    assert refused_restart.status_code == 409 and "Only failed or cancelled jobs" in refused_restart.json()["detail"]
    assert refused_stop.status_code == 409 and "already failed" in refused_stop.json()["detail"]
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.FAILED


def test_pause_stops_after_a_checkpoint_and_resume_restarts_the_same_job(owner):
    job = submit(owner)
    url = f"{BASE}/training/runs/{job.public_id}"

    paused = owner.client().post(f"{url}/pause")
    other_gpu = owner.client().post(f"{url}/resume", {"gpuType": "H100"}, format="json")
    resumed = owner.client().post(f"{url}/resume", {"imageTag": "main"}, format="json")

    assert paused.json() == {"status": "STOPPED"}
    assert other_gpu.status_code == 422 and other_gpu.json()["detail"][0]["loc"] == ["body", "gpuType"]
    assert resumed.json() == {"runId": job.public_id, "tokenValue": RUN_TOKEN_PLACEHOLDER, "gpuType": "cpu"}
    assert Job.objects.unscoped().get(pk=job.pk).status == JobStatus.QUEUED


def test_a_read_key_reads_but_cannot_submit_or_stop(owner, read_key):
    job = submit(owner)
    client = owner.client(read_key)

    created = client.post(f"{BASE}/training/runs", {"config": tiny_config()}, format="json")
    stopped = client.put(f"{BASE}/rft/runs/{job.public_id}/stop")

    assert client.get(f"{BASE}/rft/runs/{job.public_id}").status_code == 200
    assert created.status_code == stopped.status_code == 403
    assert stopped.json() == {"detail": "This API key lacks the 'write' scope."}
    assert Job.objects.unscoped().count() == 1 and Job.objects.unscoped().get().status == JobStatus.QUEUED


def test_a_wrong_key_is_a_401_detail(owner):
    response = owner.client("lab_not-a-real-key").get(f"{BASE}/rft/runs")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert "Missing, malformed, revoked or unknown API key" in response.json()["detail"]


def test_the_rate_limit_answers_429_with_retry_after(owner, settings):
    settings.LAB_API_RATE_LIMIT_PER_MINUTE = 2
    client = owner.client()

    answers = [client.get(f"{BASE}/rft/runs") for _ in range(3)]

    assert [answer.status_code for answer in answers] == [200, 200, 429]
    assert int(answers[2]["Retry-After"]) >= 1
    assert answers[2].json()["detail"].startswith("Too many requests")


def test_other_routes_are_a_json_404(owner):
    for method, path in [("get", "volumes"), ("post", "sandbox/status:batchGet"), ("get", "sandbox/networks"), ("get", "rft/runs/x/env-servers")]:
        response = getattr(owner.client(), method)(f"{BASE}/{path}")
        assert response.status_code == 404
        assert "docs/prime-compat.md" in response.json()["detail"]


def test_an_outsider_gets_the_same_404_as_a_missing_run_everywhere_and_changes_nothing(owner, outsider, job_with_data):
    restartable = submit(owner)
    job_transition(job=restartable, to=JobStatus.CANCELLED)
    routes = [
        ("get", "rft/runs/{id}"), ("get", "rft/runs/{id}/logs"), ("get", "rft/runs/{id}/metrics"),
        ("get", "rft/runs/{id}/samples"), ("get", "rft/runs/{id}/progress"), ("get", "rft/runs/{id}/distributions"),
        ("get", "rft/runs/{id}/checkpoints"), ("get", "billing/runs/{id}/usage"), ("put", "rft/runs/{id}/stop"),
        ("put", "rft/runs/{id}/restart"), ("delete", "rft/runs/{id}"), ("delete", "training/runs/{id}"),
        ("post", "training/runs/{id}/pause"), ("post", "training/runs/{id}/resume"),
    ]
    for job in (job_with_data, restartable):
        for method, route in routes:
            foreign = getattr(outsider.client(), method)(f"{BASE}/{route.format(id=job.public_id)}")
            missing = getattr(owner.client(), method)(f"{BASE}/{route.format(id='job_doesnotexist00000000')}")
            assert (foreign.status_code, foreign.json()) == (missing.status_code, missing.json()) == (
                404, {"detail": "No such run."},
            ), (method, route)

    assert outsider.client().get(f"{BASE}/rft/runs").json() == {"runs": [], "total": 0, "page": 1, "limit": 20, "total_pages": 0}
    assert Job.objects.unscoped().get(pk=job_with_data.pk).status == JobStatus.SUCCEEDED
    assert Job.objects.unscoped().get(pk=restartable.pk).status == JobStatus.CANCELLED



@pytest.mark.parametrize(
    ("body", "status", "start"),
    [
        ('{"config": {"deep": ' + "[" * 3000 + "]" * 3000 + "}}", 400, "Malformed request body"),
        ('{"config": {"name": "nul\\u0000", "max_steps": 1' + "0" * 30 + "}}", 422, None),
    ],
    ids=["deeply-nested", "nul-and-huge-number"],
)
def test_hostile_run_bodies_get_a_4xx_detail_and_create_nothing(owner, body, status, start):
    response = owner.client().post(f"{BASE}/training/runs", body, content_type="application/json")

    assert response.status_code == status, response.content
    detail = response.json()["detail"]
    assert detail.startswith(start) if start else {item["loc"][1] for item in detail} >= {"name", "max_steps"}
    assert not Job.objects.unscoped().exists()


def test_bodies_and_paths_refused_before_the_api_keep_labs_error_message(owner):
    """The body-size and NUL checks answer for every route before any view (lab.middleware), in
    Lab's error body; the CLI prints its text after ``HTTP <status>:``."""
    oversized = owner.client().post(
        f"{BASE}/training/runs", '{"config": {"name": "' + "x" * 1_100_000 + '"}}', content_type="application/json"
    )
    nul = owner.client().get(f"{BASE}/rft/runs/job_%00")

    assert oversized.status_code == 413 and "larger than 1 MB" in oversized.content.decode()
    assert nul.status_code == 400
    assert not Job.objects.unscoped().exists()


@pytest.mark.parametrize(
    ("run_id", "detail"),
    [("job_" + "x" * 300, "No such run."), ("..%2F..%2Fjobs", "Lab's Prime-compatible API does not serve this route; see docs/prime-compat.md.")],
    ids=["too-long", "traversal"],
)
def test_odd_run_ids_are_a_404(owner, run_id, detail):
    response = owner.client().get(f"{BASE}/rft/runs/{run_id}")

    assert (response.status_code, response.json()) == (404, {"detail": detail})


def test_gpu_type_fills_a_lab_layout_spec_too_and_the_pool_checks_it(owner, spec):
    client = owner.client()

    on_cpu = client.post(f"{BASE}/training/runs", {"config": spec, "gpuType": "cpu"}, format="json")
    on_h100 = client.post(f"{BASE}/training/runs", {"config": spec, "gpuType": "H100"}, format="json")

    assert on_cpu.status_code == 200, on_cpu.content
    assert Job.objects.unscoped().get().gpu_type == "cpu"
    assert on_h100.status_code == 422
    assert [item["loc"] for item in on_h100.json()["detail"]] == [["body", "resources", "gpu_type"]]


def test_mode_sft_is_refused_pointing_at_loss_sft_which_a_run_of_mode_rl_takes(owner, spec):
    refused = owner.client().post(f"{BASE}/training/runs", {"config": tiny_config(), "mode": "sft"}, format="json")
    teacher = {"model": "t", "client": {"base_url": "https://api.example.com/v1", "api_key_var": "OPENAI_API_KEY"}}
    config = {**spec, "loss": "sft", "teacher": teacher, "secrets": {"OPENAI_API_KEY": "sk-test"}}
    distilled = owner.client().post(f"{BASE}/training/runs", {"config": config, "mode": "rl"}, format="json")

    assert refused.status_code == 422
    message = refused.json()["detail"][0]["msg"]
    assert "not on a fixed dataset" in message and 'loss = "sft"' in message and "[teacher]" in message
    assert distilled.status_code == 200, distilled.content
    assert Job.objects.unscoped().get(public_id=distilled.json()["runId"]).spec["loss"] == "sft"
