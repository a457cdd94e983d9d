"""The SDK's ``lab.evals`` (in process, through the WSGI application) and the ``lab evals``
command (as a subprocess, against a live server) on the real evaluation API."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from labsdk import Lab, NotFoundError
from labsdk.errors import BadRequestError, JobFailedError, WaitTimeoutError

from evaluations.models import Evaluation
from jobs.models import Adapter, AdapterStatus, Job, JobStatus
from jobs.secrets.services import engine_secrets
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.cli import LAB_SCRIPT, lab_cli
from tests.support.evaluations import end_evaluation, evaluation_body, sample
from tests.support.jobs_helpers import Engine, ready_checkpoint, submit
from tests.support.serving import ready_adapter

BODY = evaluation_body()
LAB_COMMAND = [str(LAB_SCRIPT)] if LAB_SCRIPT.exists() else [sys.executable, "-m", "labsdk.cli"]


@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks", "no_broker")
def test_the_sdk_creates_waits_for_and_reads_an_evaluation(owner, outsider, wsgi_transport):
    lab = Lab(api_key=owner.key, base_url="http://testserver", transport=wsgi_transport, max_retries=0)
    created = lab.evals.create(
        model="lab/tiny-random-llama", environments=BODY["environments"], sampling=BODY["sampling"], name="sdk",
    )
    assert (created.id[:5], created.status, created.name, created.progress) == ("eval_", "queued", "sdk", {"samples": 0, "expected_samples": 8})
    with pytest.raises(WaitTimeoutError, match=f"evaluation {created.id} is still queued"):
        lab.evals.wait(created.id, timeout=0, progress=False)
    end_evaluation(created.id, JobStatus.SUCCEEDED)
    done = lab.evals.wait(created.id, timeout=5, progress=False)
    assert done.status == "succeeded"
    assert done.results["lab/addition"]["samples"] == 6
    assert done.results["lab/addition"]["reward_mean"] == pytest.approx(4 / 6)
    assert [e.id for e in lab.evals.list()] == [created.id]
    assert lab.evals.get(created.id).results == done.results
    everything = lab.evals.samples(created.id)
    assert len(everything) == 8
    solved = lab.evals.samples(created.id, environment="lab/addition", min_reward=1.0)
    assert [(s.example, s.rollout, s.reward) for s in solved] == [(0, 0, 1.0), (0, 1, 1.0), (2, 0, 1.0), (2, 1, 1.0)]
    assert len(lab.evals.samples(created.id, limit=3)) == 3
    assert [s.id for s in lab.evals.iter_samples(created.id, page_size=3)] == [s.id for s in everything]
    with pytest.raises(ValueError):
        lab.evals.create(environments=["lab/addition"])
    with pytest.raises(BadRequestError) as refused:
        lab.evals.create(model="lab/tiny-random-llama", environments=[{"id": "lab/addition", "args": {"colour": 1}}])
    assert refused.value.param == "environments.0.args.colour"
    theirs = Lab(api_key=outsider.key, base_url="http://testserver", transport=wsgi_transport, max_retries=0)
    with pytest.raises(NotFoundError):
        theirs.evals.get(created.id)
    with pytest.raises(NotFoundError):
        theirs.evals.samples(created.id)
    failing = lab.evals.create(checkpoint=None, model="lab/tiny-random-llama", environments=["lab/reverse-text"])
    end_evaluation(failing.id, JobStatus.FAILED, rows=[])
    with pytest.raises(JobFailedError, match=f"evaluation {failing.id} failed") as failed:
        lab.evals.wait(failing.id, timeout=5, progress=False)
    assert failed.value.job.results == {
        "lab/reverse-text": {
            "samples": 0, "examples": 0, "reward_mean": None, "reward_stderr": None, "functions": {}, "pass_at_k": {},
            "errors": 0, "timeouts": 0, "truncated": 0, "tokens": {"prompt": 0, "completion": 0},
        }
    }


@pytest.mark.django_db(transaction=True)
def test_the_cli_runs_lists_shows_samples_and_cancels(live_server, owner, tmp_path):
    def cli(*argv: str):
        return lab_cli(*argv, key=owner.key, base_url=live_server.url)

    ran = cli("evals", "run", "--model", "lab/tiny-random-llama", "--env", "lab/addition", "--env", "lab/reverse-text",
              "--env-args", 'lab/addition={"max_operand": 9}', "--num-examples", "2", "--rollouts", "2",
              "--temperature", "0.5", "--max-tokens", "8", "--seed", "4", "--name", "from-cli")
    assert ran.returncode == 0, ran.stderr
    evaluation_id = ran.stdout.strip()
    evaluation = Evaluation.objects.unscoped().get(public_id=evaluation_id)
    assert evaluation.environments == [
        {"id": "lab/addition", "args": {"max_operand": 9}, "num_examples": 2, "rollouts_per_example": 2},
        {"id": "lab/reverse-text", "args": {}, "num_examples": 2, "rollouts_per_example": 2},
    ]
    assert evaluation.sampling == {"temperature": 0.5, "top_p": 1.0, "max_tokens": 8, "seed": 4}
    listed = cli("evals", "list")
    assert listed.returncode == 0 and evaluation_id in listed.stdout and "from-cli" in listed.stdout and "0/8" in listed.stdout
    end_evaluation(evaluation_id, JobStatus.SUCCEEDED)
    shown = cli("evals", "get", evaluation_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith(f"{evaluation_id} succeeded model lab/tiny-random-llama")
    addition = next(line for line in shown.stdout.splitlines() if line.startswith("lab/addition"))
    assert addition.split()[:3] == ["lab/addition", "4", "0.500"]
    samples = cli("evals", "samples", evaluation_id, "--env", "lab/addition", "--min-reward", "1", "--json")
    assert [(s["example"], s["rollout"]) for s in json.loads(samples.stdout)] == [(0, 0), (0, 1)]
    body = tmp_path / "eval.toml"
    body.write_text('model = { type = "model", id = "lab/tiny-random-llama" }\n[[environments]]\nid = "lab/addition"\nnum_examples = 1\n')
    from_file = cli("evals", "run", "-f", str(body), "--json")
    assert from_file.returncode == 0, from_file.stderr
    queued = json.loads(from_file.stdout)
    cancelled = cli("evals", "cancel", queued["id"])
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{queued['id']} cancelled\n")
    refused = cli("evals", "run", "--model", "lab/tiny-random-llama", "--env", "lab/nope")
    assert refused.returncode == 1
    assert "environments.0.id" in refused.stderr and "(invalid_request)" in refused.stderr
    missing = cli("evals", "get", "eval_doesnotexist")
    assert (missing.returncode, missing.stderr) == (1, "error: No such evaluation. (not_found)\n")
    usage = cli("evals", "run", "--env", "lab/addition")
    assert usage.returncode == 2 and "--model, --checkpoint, --adapter, --deployment ID or --endpoint URL" in usage.stderr
    assert cli("evals", "run", "--model", "m", "--env", "e", "--num-examples", "0").returncode == 2


@pytest.mark.django_db(transaction=True)
def test_lab_checkpoints_eval_evaluates_a_ready_checkpoint(live_server, owner, outsider, spec):
    checkpoint_id, _ = ready_checkpoint(Engine(submit(owner, spec, lora_rank=4, lora_alpha=8)))
    ran = lab_cli("checkpoints", "eval", checkpoint_id, "--env", "lab/addition", "--num-examples", "2", "--json",
                  key=owner.key, base_url=live_server.url)
    assert ran.returncode == 0, ran.stderr
    created = json.loads(ran.stdout)
    assert (created["model"], created["base_model"]) == ({"type": "checkpoint", "id": checkpoint_id}, "lab/tiny-random-llama")
    job = Job.objects.unscoped().get(public_id=created["job_id"])
    assert (job.spec["init_from"], job.spec["lora_rank"]) == (checkpoint_id, 4)
    foreign = lab_cli("checkpoints", "eval", checkpoint_id, "--env", "lab/addition", key=outsider.key, base_url=live_server.url)
    assert (foreign.returncode, foreign.stderr) == (1, "error: No such checkpoint. (not_found)\n")


@pytest.mark.django_db(transaction=True)
def test_env_args_apply_to_the_env_they_name_with_or_without_owner_or_version(live_server, owner):
    def cli(*argv: str):
        return lab_cli(*argv, key=owner.key, base_url=live_server.url)

    for key, text in (("addition", '{"max_operand": 9}'), ("lab/addition@0.1.0", "{max_operand = 9}")):
        ran = cli("evals", "run", "--model", "lab/tiny-random-llama", "--env", "lab/addition", "--env-args", f"{key}={text}")
        assert ran.returncode == 0, ran.stderr
        evaluation = Evaluation.objects.unscoped().get(public_id=ran.stdout.strip())
        assert evaluation.environments[0]["args"] == {"max_operand": 9}
    for environment, key in (("lab/addition", "lab/reverse-text"), ("lab/nope@2", "addition")):
        unmatched = cli("evals", "run", "--model", "m", "--env", environment, "--env-args", f"{key}={{}}")
        assert unmatched.returncode == 2 and f"--env-args {key}: no --env names" in unmatched.stderr, unmatched.stderr
    mismatched_version = cli("evals", "run", "--model", "m", "--env", "lab/addition@1", "--env-args", "lab/addition@2={}")
    assert mismatched_version.returncode == 2
    not_an_object = cli("evals", "run", "--model", "m", "--env", "lab/addition", "--env-args", "lab/addition=5")
    assert not_an_object.returncode == 2 and "--env-args lab/addition must be an object" in not_an_object.stderr


@pytest.mark.django_db(transaction=True)
def test_an_ended_evaluation_of_all_examples_lists_the_samples_it_has(live_server, owner):
    def cli(*argv: str):
        return lab_cli(*argv, key=owner.key, base_url=live_server.url)

    ran = cli("evals", "run", "--model", "lab/tiny-random-llama", "--env", "lab/addition", "--num-examples", "all")
    assert ran.returncode == 0, ran.stderr
    evaluation_id = ran.stdout.strip()
    running = cli("evals", "list")
    assert f"{evaluation_id}" in running.stdout and " 0/? " in running.stdout, running.stdout
    end_evaluation(evaluation_id, JobStatus.SUCCEEDED, rows=[sample(0, example, 0, num_examples=6) for example in range(6)])
    listed = cli("evals", "list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith(evaluation_id))
    assert " 6 " in row and "/?" not in row, listed.stdout
    # Its results on an 80-column terminal: every reward function whole, on a row of its own.
    narrow = subprocess.run(
        [*LAB_COMMAND, "evals", "get", evaluation_id], capture_output=True, text=True, timeout=60,
        env={**os.environ, "LAB_BASE_URL": live_server.url, "LAB_API_KEY": owner.key, "NO_COLOR": "1", "COLUMNS": "80"},
    )
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines[1:]), narrow.stdout
    assert [line.split() for line in lines if line.startswith("lab/addition") and "correct" in line] == [["lab/addition", "correct", "0.000"]]


@pytest.mark.django_db
@pytest.mark.usefixtures("commit_callbacks", "no_broker")
def test_the_sdk_evaluates_an_adapter_and_an_endpoint(owner, outsider, wsgi_transport, spec):
    lab = Lab(api_key=owner.key, base_url="http://testserver", transport=wsgi_transport, max_retries=0)
    # A ready adapter row (made directly: Django's test client would undo what wsgi_transport sets up).
    trained = submit(owner, spec, lora_rank=4, lora_alpha=8)
    adapter_id = Adapter.objects.create(job=trained, step=2, attempt=1, format="peft-lora", status=AdapterStatus.READY).public_id
    adapted = lab.evals.create(adapter=adapter_id, environments=BODY["environments"])
    assert (adapted.model, adapted.base_model) == ({"type": "adapter", "id": adapter_id}, "lab/tiny-random-llama")
    endpoint = {"base_url": "https://models.example.com/v1", "model": "acme/chat"}
    remote = lab.evals.create(endpoint=endpoint, api_key_secret="ACME_KEY", secrets={"ACME_KEY": "sk-1234"},
                              environments=BODY["environments"])
    assert (remote.model, remote.details) == (
        {"type": "endpoint", "id": "acme/chat"}, {"endpoint": {"base_url": endpoint["base_url"], "api_key_secret": "ACME_KEY"}},
    )
    with pytest.raises(BadRequestError) as missing:
        lab.evals.create(endpoint=endpoint, api_key_secret="ACME_KEY", environments=BODY["environments"])
    assert (missing.value.param, missing.value.code) == ("model.api_key_secret", "invalid_request")
    with pytest.raises(NotFoundError):
        Lab(api_key=outsider.key, base_url="http://testserver", transport=wsgi_transport, max_retries=0).evals.create(
            adapter=adapter_id, environments=BODY["environments"],
        )
    with pytest.raises(ValueError, match="exactly one of"):
        lab.evals.create(adapter=adapter_id, model="lab/tiny-random-llama", environments=BODY["environments"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("artifact_storage")
def test_the_cli_evaluates_an_adapter_and_an_endpoint_with_a_secret(live_server, owner):
    def cli(*argv: str):
        return lab_cli(*argv, key=owner.key, base_url=live_server.url)

    adapter_id = ready_adapter(owner)
    ran = cli("evals", "run", "--adapter", adapter_id, "--env", "lab/addition", "--num-examples", "2", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["model"] == {"type": "adapter", "id": adapter_id}
    ran = cli("evals", "run", "--endpoint", "https://models.example.com/v1", "--endpoint-model", "acme/chat",
              "--api-key-secret", "ACME_KEY", "--secret", "ACME_KEY=sk-from-shell", "--env", "lab/addition", "--json")
    assert ran.returncode == 0, ran.stderr
    created = json.loads(ran.stdout)
    assert created["details"] == {"endpoint": {"base_url": "https://models.example.com/v1", "api_key_secret": "ACME_KEY"}}
    assert engine_secrets(job_id=created["job_id"]) == {"ACME_KEY": "sk-from-shell"}
    both = cli("evals", "run", "--adapter", adapter_id, "--endpoint", "https://h/v1", "--env", "lab/addition")
    assert both.returncode == 2
    # A loopback endpoint: refused at submit, with what to do about it for an engine (not a webhook).
    loopback = cli("evals", "run", "--endpoint", "http://127.0.0.1:9/v1", "--endpoint-model", "acme/chat",
                   "--api-key-secret", "ACME_KEY", "--secret", "ACME_KEY=sk", "--env", "lab/addition")
    assert loopback.returncode == 1, loopback.stderr
    assert "  model.base_url: 127.0.0.1 resolves to a private or loopback address (127.0.0.1)." in loopback.stderr
    assert "[private_address]" in loopback.stderr
    assert "hint: Lab refuses an endpoint on a loopback or private address for its engines unless it runs with " \
           "LAB_ENGINE_EGRESS_ALLOW_PRIVATE=1" in loopback.stderr
    assert "LAB_WEBHOOK_ALLOW_PRIVATE" not in loopback.stderr
