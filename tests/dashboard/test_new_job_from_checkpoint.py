""""New job from this checkpoint": the job form prefilled with the checkpoint's job spec and
``init_from`` naming it; a missing, foreign or unready checkpoint is a 404."""

from __future__ import annotations

import tomllib

import pytest

from jobs.models import Checkpoint, CheckpointStatus, Job
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

PROJECT = "/o/acme/p/default/"


def ready_checkpoint(tenant, spec, **fields) -> Checkpoint:
    job = submit(tenant, spec, name="adder", metadata={"team": "rl"})
    Engine(job).running(step=4)
    return Checkpoint.objects.create(job=job, step=4, attempt=1, format="peft-lora", size_bytes=1000, sha256="0" * 64,
                                     status=fields.pop("status", CheckpointStatus.READY), **fields)


def test_the_form_is_prefilled_with_the_jobs_spec_and_init_from(owner, owner_client, spec):
    checkpoint = ready_checkpoint(owner, spec)
    stored = Job.objects.unscoped().get(pk=checkpoint.job_id).spec

    response = owner_client.get(f"{PROJECT}jobs/new/?from_checkpoint={checkpoint.public_id}")

    assert response.status_code == 200
    text = response.context["form"].initial["spec"]
    assert text.startswith(f"# A new job from {checkpoint.public_id}: step 4 of {checkpoint.job.public_id}")
    prefilled = tomllib.loads(text)
    assert prefilled["init_from"] == checkpoint.public_id
    assert prefilled["name"] == "adder-from-step-4"
    assert {k: v for k, v in prefilled.items() if k not in ("init_from", "name")} == {
        k: v for k, v in stored.items() if k not in ("init_from", "name") and v is not None
    }


def test_submitting_it_starts_a_job_from_the_checkpoint(owner, owner_client, spec):
    checkpoint = ready_checkpoint(owner, spec)
    text = owner_client.get(f"{PROJECT}jobs/new/?from_checkpoint={checkpoint.public_id}").context["form"].initial["spec"]

    estimated = owner_client.post(f"{PROJECT}jobs/new/", {"format": "toml", "spec": text, "action": "estimate"})
    assert estimated.context["estimate"] is not None, estimated.context["form"].errors
    submitted = owner_client.post(f"{PROJECT}jobs/new/", {
        "format": "toml", "spec": text, "action": "submit",
        "estimated": estimated.context["digest"], "submission": estimated.context["submission"],
    })

    assert submitted.status_code == 302
    new = Job.objects.unscoped().exclude(pk=checkpoint.job_id).get()
    assert (new.spec["init_from"], new.name) == (checkpoint.public_id, "adder-from-step-4")


def test_the_job_page_links_ready_checkpoints_only(owner, owner_client, spec):
    checkpoint = ready_checkpoint(owner, spec)
    pending = Checkpoint.objects.create(job=checkpoint.job, step=2, attempt=1, format="peft-lora",
                                        status=CheckpointStatus.UPLOADING)

    listing = owner_client.get(f"{PROJECT}jobs/{checkpoint.job.public_id}/checkpoints/").content.decode()

    assert f"jobs/new/?from_checkpoint={checkpoint.public_id}" in listing
    assert f"from_checkpoint={pending.public_id}" not in listing


@pytest.mark.parametrize("whose", ["missing", "foreign", "not_ready"])
def test_a_missing_foreign_or_unready_checkpoint_is_a_404(owner, outsider, owner_client, spec, whose):
    checkpoint_id = {
        "missing": lambda: "ckpt_doesnotexist",
        "foreign": lambda: ready_checkpoint(outsider, spec).public_id,
        "not_ready": lambda: ready_checkpoint(owner, spec, status=CheckpointStatus.FAILED).public_id,
    }[whose]()

    response = owner_client.get(f"{PROJECT}jobs/new/?from_checkpoint={checkpoint_id}")

    assert response.status_code == 404
