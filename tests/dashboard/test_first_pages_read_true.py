"""What a newcomer reads on the job, webhook and compare pages is true and unambiguous: a job
that ended without a step says so instead of drawing empty charts, an engine that failed its
checks never reads as training, the histograms say they count stored samples, checkpoint rows
keep the id apart from their actions, deliveries name their job and the compare picker shows ids."""

from __future__ import annotations

import json
import re

import pytest

from jobs.models import Checkpoint, CheckpointStatus, JobEvent, JobStatus
from jobs.services import job_transition
from jobs.webhooks import outbox
from jobs.webhooks.endpoints import endpoint_create
from jobs.webhooks.models import WebhookDelivery
from lab.audit import Actor
from tests.support.jobs_helpers import Engine, submit

pytestmark = pytest.mark.django_db

PROJECT = "/o/acme/p/default/"
REFUSAL = "engine: env.0.args.max_digit: 'lab/addition' takes no argument 'max_digit'"


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Keep the run pipeline's tasks from reaching a broker: these tests look at pages."""


def page_data(page: str) -> dict:
    return json.loads(re.search(r'<script id="job-data" type="application/json">(.*?)</script>', page, re.DOTALL).group(1))


def failed_at_validation(owner, spec):
    """A job whose engine logged its refusal of the spec and reported failing, as one does."""
    job = submit(owner, spec, name="refused")
    engine = Engine(job)
    engine.logs(REFUSAL)
    engine.post("finish", {"attempt": 1, "outcome": "failed", "error": {"code": "invalid_spec", "message": REFUSAL}})
    return job, engine


def test_an_engine_that_fails_its_checks_never_reads_as_training(owner, spec):
    job, engine = failed_at_validation(owner, spec)
    job.refresh_from_db()
    assert job.status == JobStatus.STARTING  # its log line and its end report prove no training

    engine.metrics((1, {"reward/mean": 0.5}))  # a step does
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert JobEvent.objects.get(job=job, type="job.started").message == "The engine is training."


def test_a_job_that_ended_without_a_step_says_so_instead_of_drawing_charts(owner, owner_client, spec):
    job, _ = failed_at_validation(owner, spec)
    job_transition(job=job, to=JobStatus.FAILED, error_code="invalid_spec", error_message=REFUSAL)

    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()

    assert "No steps were recorded: the job ended (failed) before its first step" in page
    assert "charts fill in as steps land" not in page
    assert page_data(page)["ended_without_steps"] is True
    assert '<div class="chart-controls" hidden>' in page
    events = re.search(r'<ol class="timeline" id="events">(.*?)</ol>', page, re.DOTALL).group(1)
    assert "job.failed" in events and "job.started" not in events and "training" not in events


def test_a_running_job_without_steps_yet_keeps_its_charts(owner, owner_client, spec):
    job = submit(owner, spec)
    Engine(job).running(0)

    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()

    assert "charts fill in as steps land" in page and page_data(page)["ended_without_steps"] is False


def test_the_histograms_say_they_count_the_stored_samples(owner, owner_client, spec):
    job = submit(owner, spec, max_steps=30)
    engine = Engine(job)
    engine.running(0)
    engine.samples(3, [{"group": 0, "prompt": "1+1=", "completion": str(n), "reward": n / 2, "advantage": 0.0} for n in range(3)])

    rollouts = owner_client.get(f"{PROJECT}jobs/{job.public_id}/rollouts/?step=3&keep=reward>0").content.decode()

    assert "The histograms count the 3 rollout samples Lab stored for step 3" in rollouts


def test_a_checkpoint_row_keeps_its_id_apart_from_its_actions(owner, owner_client, spec):
    job = submit(owner, spec, max_steps=30)
    Engine(job).running(2)
    ready = Checkpoint.objects.create(job=job, step=2, attempt=1, status=CheckpointStatus.READY, format="peft-lora",
                                      size_bytes=1000, sha256="0" * 64)

    page = owner_client.get(f"{PROJECT}jobs/{job.public_id}/").content.decode()
    table = re.search(r'<div id="job-checkpoints">(.*?)</div>', page, re.DOTALL).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", re.search(r"<tbody>(.*?)</tbody>", table, re.DOTALL).group(1), re.DOTALL)

    assert "<th>ID</th>" in table and "<th>Actions</th>" in table
    assert cells[1] == f'<code class="small">{ready.public_id}</code>'
    actions = re.findall(r'<a class="button[^"]*"[^>]*>([^<]*)</a>', cells[-1])
    assert actions == ["Download", "New job from this", "Evaluate"]
    assert re.findall(r'<button type="submit"[^>]*>([^<]*)</button>', cells[-1]) == ["Deploy"]
    assert ready.public_id not in re.sub(r'(href|value)="[^"]*"', "", cells[-1])


def test_a_delivery_row_names_its_job(owner, owner_client, spec, monkeypatch, settings):
    settings.LAB_WEBHOOK_ALLOW_PRIVATE = True
    monkeypatch.setattr(outbox, "deliver_on_commit", lambda *args, **kwargs: None)
    endpoint = endpoint_create(project=owner.project, actor=Actor(user=owner.user), data={"url": "http://127.0.0.1:9/hook"})
    job = submit(owner, spec, name="adder")
    delivery = WebhookDelivery.objects.filter(endpoint=endpoint).select_related("message").get()

    page = owner_client.get(f"{PROJECT}webhooks/{endpoint.public_id}/").content.decode()
    summary = re.search(rf"data-delivery=\"{delivery.public_id}\">\s*<summary>(.*?)</summary>", page, re.DOTALL).group(1)

    assert delivery.message.type == "job.queued"
    assert f'<a class="delivery-job" href="{PROJECT}jobs/{job.public_id}/">adder</a>' in summary
    assert f"<code class=\"muted small\">{job.public_id}</code>" in summary


def test_the_compare_picker_shows_each_jobs_id_beside_its_name(owner, owner_client, spec):
    first, second = submit(owner, spec, name="same"), submit(owner, spec, name="same")

    page = owner_client.get(f"{PROJECT}compare/?job={first.public_id}&job={second.public_id}").content.decode()

    for job in (first, second):
        assert re.search(rf'value="{job.public_id}" checked> same <code class="muted small">{job.public_id}</code>', page)
    header = re.search(r"<thead><tr><th>Key</th>(.*?)</tr></thead>", page, re.DOTALL)
    assert header is None or all(job.public_id in header.group(1) for job in (first, second))
