""""Evaluate" on a checkpoint's row of the job page: a small form prefilled from the checkpoint's
job that starts an evaluation through the evaluations service, once however often it is posted;
its problems next to their fields; another organization's checkpoint is a 404."""

from __future__ import annotations

import pytest

from evaluations.models import Evaluation
from jobs.models import Checkpoint, CheckpointStatus, Job
from lab.models import AuditLogEntry
from tests.support.jobs_helpers import Engine, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

PROJECT = "/o/acme/p/default/"
NEW = PROJECT + "evaluations/new/"


def ready_checkpoint(tenant, spec) -> Checkpoint:
    job = submit(tenant, spec, name="adder", lora_rank=8, lora_alpha=16)
    Engine(job).running(step=4)
    return Checkpoint.objects.create(job=job, step=4, attempt=1, format="peft-lora", size_bytes=1000, sha256="0" * 64,
                                     status=CheckpointStatus.READY)


def form_data(checkpoint: Checkpoint, submission: str = "token-1", **changes) -> dict:
    return {
        "target_type": "checkpoint", "target_id": checkpoint.public_id, "name": "adder step 4",
        "environments": ["lab/addition"], "args": '{"lab/addition": {"max_operand": 9}}', "num_examples": "16",
        "rollouts_per_example": "4", "temperature": "0.7", "top_p": "0.95", "max_tokens": "8", "seed": "3",
        "gpu_type": "cpu", "gpus": "", "submission": submission, **changes,
    }


def test_the_checkpoint_row_offers_evaluate_with_a_form_prefilled_from_its_job(owner, owner_client, spec):
    checkpoint = ready_checkpoint(owner, spec)
    page = owner_client.get(f"{PROJECT}jobs/{checkpoint.job.public_id}/").content.decode()
    assert f'href="{NEW}?checkpoint={checkpoint.public_id}"' in page
    response = owner_client.get(f"{NEW}?checkpoint={checkpoint.public_id}")
    assert response.status_code == 200
    initial = response.context["form"].initial
    assert (initial["target_type"], initial["target_id"], initial["name"]) == ("checkpoint", checkpoint.public_id, "adder step 4")
    assert initial["environments"] == [block["id"] for block in spec["env"]]
    assert initial["max_tokens"] == spec["sampling"]["max_tokens"]
    assert response.context["submission"]
    assert 'name="submission" value="' + response.context["submission"] + '"' in response.content.decode()


def test_posting_the_form_starts_one_evaluation_of_the_checkpoint(owner, owner_client, spec):
    checkpoint = ready_checkpoint(owner, spec)
    first = owner_client.post(NEW, form_data(checkpoint))
    evaluation = Evaluation.objects.unscoped().get()
    assert first.status_code == 302 and first["Location"] == f"{PROJECT}evaluations/{evaluation.public_id}/"
    assert (evaluation.target_type, evaluation.target_id, evaluation.name) == ("checkpoint", checkpoint.public_id, "adder step 4")
    assert evaluation.environments == [
        {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 16, "rollouts_per_example": 4}
    ]
    assert evaluation.sampling == {"temperature": 0.7, "top_p": 0.95, "max_tokens": 8, "seed": 3}
    assert Job.objects.unscoped().get(pk=evaluation.job_id).spec["init_from"] == checkpoint.public_id
    again = owner_client.post(NEW, form_data(checkpoint), follow=True)  # a double click, a resend
    assert Evaluation.objects.unscoped().count() == 1
    assert again.redirect_chain[-1][0] == f"{PROJECT}evaluations/{evaluation.public_id}/"
    assert "Already started: adder step 4." in again.content.decode()
    # Back, another seed, submit: the used token refuses it and the form comes back with a new one.
    conflicting = owner_client.post(NEW, form_data(checkpoint, seed="4"))
    assert conflicting.status_code == 400 and Evaluation.objects.unscoped().count() == 1
    assert "This form already started an evaluation with other values" in conflicting.content.decode()
    fresh = conflicting.context["submission"]
    assert fresh != "token-1" and f'name="submission" value="{fresh}"' in conflicting.content.decode()
    assert AuditLogEntry.objects.filter(action="evaluation.create").count() == 1
    owner_client.post(NEW, form_data(checkpoint, seed="4", submission=fresh))
    assert sorted(Evaluation.objects.unscoped().values_list("sampling__seed", flat=True)) == [3, 4]


@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"args": '{"lab/addition": {"max_operandd": 9}}'}, "args", "environments.0.args.max_operandd"),
        ({"args": "not json"}, "args", "Not JSON"),
        ({"num_examples": "0"}, "num_examples", "environments.0.num_examples"),
        ({"num_examples": "some"}, "num_examples", 'Enter a whole number, or "all".'),
        ({"top_p": "0"}, "top_p", "sampling.top_p"),
        ({"max_tokens": "100000"}, "max_tokens", "sampling.max_tokens"),
        ({"environments": ["lab/nope"]}, "environments", "Select a valid choice"),
    ],
)
def test_problems_are_shown_next_to_their_fields_and_nothing_starts(owner, owner_client, spec, changes, field, message):
    checkpoint = ready_checkpoint(owner, spec)
    response = owner_client.post(NEW, form_data(checkpoint, **changes))
    assert response.status_code == 400
    assert any(message in error for error in response.context["form"].errors[field]), response.context["form"].errors
    assert not Evaluation.objects.unscoped().exists()


def test_a_catalogue_model_is_evaluated_from_the_list(owner, owner_client):
    page = owner_client.get(NEW)
    assert page.status_code == 200 and "lab/tiny-random-llama" in page.context["models"]
    response = owner_client.post(NEW, {
        "target_type": "model", "target_id": "lab/tiny-random-llama", "environments": ["lab/reverse-text"],
        "num_examples": "all", "rollouts_per_example": "1", "temperature": "1", "top_p": "1", "max_tokens": "8",
        "seed": "0", "gpu_type": "cpu", "submission": "token-m",
    })
    assert response.status_code == 302
    evaluation = Evaluation.objects.unscoped().get()
    assert (evaluation.target_type, evaluation.target_id, evaluation.environments[0]["num_examples"]) == (
        "model", "lab/tiny-random-llama", "all"
    )


def test_another_organizations_checkpoint_is_a_404_and_starts_nothing(owner, outsider, outsider_client, spec):
    checkpoint = ready_checkpoint(owner, spec)
    url = "/o/globex/p/default/evaluations/new/"
    foreign = outsider_client.get(f"{url}?checkpoint={checkpoint.public_id}")
    missing = outsider_client.get(f"{url}?checkpoint=ckpt_doesnotexist")
    assert foreign.status_code == missing.status_code == 404
    posted = outsider_client.post(url, form_data(checkpoint))
    assert posted.status_code == 404
    assert outsider_client.get(f"{url}?adapter=adp_doesnotexist").status_code == 404
    assert not Evaluation.objects.unscoped().exists()
