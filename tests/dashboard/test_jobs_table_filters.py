"""The project's jobs table filtered by model and by a metadata tag, with an ETA on running jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.templatetags.lab_display import duration
from jobs.models import Job
from jobs.selectors import job_eta_seconds
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

TABLE = "/o/acme/p/default/jobs/table/"


def listed(client, **query) -> list[str]:
    response = client.get("/o/acme/p/default/", query)
    assert response.status_code == 200
    return [job.name for job, _ in response.context["jobs"]]


def test_it_filters_by_model_and_by_tag(owner, owner_client, spec):
    submit(owner, spec, name="tiny-research", metadata={"team": "research"})
    submit(owner, spec, name="tiny-infra", metadata={"team": "infra"})
    submit(owner, {**spec, "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}, name="smol-research", metadata={"team": "research"})

    assert listed(owner_client, model="lab/tiny-random-llama") == ["tiny-infra", "tiny-research"]
    assert listed(owner_client, tag="team=research") == ["smol-research", "tiny-research"]
    assert listed(owner_client, tag="team=research", model="lab/tiny-random-llama") == ["tiny-research"]
    assert listed(owner_client, tag="team=nobody") == []
    assert listed(owner_client, tag="not a pair") == ["smol-research", "tiny-infra", "tiny-research"]
    page = owner_client.get("/o/acme/p/default/", {"model": "lab/tiny-random-llama"}).content.decode()
    assert 'model=lab/tiny-random-llama' in page  # the table's refresh keeps the filter
    assert '<option value="HuggingFaceTB/SmolLM2-135M-Instruct">' in page


def test_it_filters_by_environment_whatever_the_blocks_position(owner, owner_client, spec):
    submit(owner, {**spec, "env": [{"id": "lab/addition"}]}, name="addition")
    submit(owner, {**spec, "env": [{"id": "lab/addition"}, {"id": "lab/reverse-text"}]}, name="both")
    submit(owner, {**spec, "env": [{"id": "lab/reverse-text"}]}, name="reverse")

    assert listed(owner_client, env="lab/reverse-text") == ["reverse", "both"]
    assert listed(owner_client, env="lab/addition") == ["both", "addition"]
    assert listed(owner_client, env="lab/add") == []  # an id, not a prefix of one
    assert listed(owner_client, env="lab/reverse-text", model="lab/tiny-random-llama", tag="a=b") == []
    page = owner_client.get("/o/acme/p/default/", {"env": "lab/addition"}).content.decode()
    assert "env=lab/addition" in page  # the table's refresh keeps the filter
    assert '<option value="lab/reverse-text">' in page


def test_a_running_job_shows_its_eta_at_its_pace_so_far(owner, owner_client, spec):
    job = submit(owner, spec, name="eta", max_steps=20)
    Engine(job).running(step=5)
    Job.objects.unscoped().filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=40))
    job.refresh_from_db()

    assert job_eta_seconds(job, now=job.started_at + timedelta(seconds=40)) == pytest.approx(120.0)
    assert "ETA 2 min" in owner_client.get("/o/acme/p/default/").content.decode()  # about 120 s
    assert job_eta_seconds(submit(owner, spec), now=timezone.now()) is None  # queued


@pytest.mark.parametrize(("seconds", "shown"), [(None, ""), (45.2, "45 s"), (150, "2 min"), (3900, "1 h 5 min"), (7200, "2 h")])
def test_durations_read_short(seconds, shown):
    assert duration(seconds) == shown
