"""A deployment called by other clients through a running Lab (uvicorn, tests/support/stack.py):
Prime's own CLI (``prime==0.18.0``: ``prime inference models`` and ``prime inference chat``,
streamed and not) pointed at Lab's OpenAI-compatible API with ``PRIME_INFERENCE_URL``, and the
engine's teacher client, and a one-step ``loss = "sft"`` job run by the engine, whose
``[teacher]`` names the deployment, with the spec as Lab resolved it at submit.

The inference server is the engine's serving role on the tiny model in a thread of this
process (no worker, no engine process): the deployment's rows say it runs there.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from labsdk.spec import parse_spec

from billing.models import TokenUsage
from engine.distill import TeacherClient, TeacherRefused
from jobs.specs import validate_job_spec
from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus, ServingMode, SourceType
from tests.support.serving import tiny_serving_engine
from tests.support.stack import STACK_TEST_MARKS, LabStack, wait_for

pytestmark = STACK_TEST_MARKS

PRIME = Path(sys.executable).with_name("prime")
TINY = "lab/tiny-random-llama"
NAME = "tiny-tuned"


@pytest.fixture(scope="module")
def engine():
    """The tiny model's serving role on a free port."""
    with tiny_serving_engine() as (_, url):
        yield url


@pytest.fixture
def lab(owner, engine, tmp_path, settings):
    """uvicorn on the test database, and the owner's ready deployment ``tiny-tuned`` of the tiny
    model on the engine's running server."""
    stack = LabStack(tmp_path / "stack", SECRET_KEY=settings.SECRET_KEY)
    settings.LAB_DATA_DIR = stack.data_dir
    settings.LAB_PUBLIC_URL = stack.base_url
    stack.data_dir.mkdir(parents=True)
    server = InferenceServer.objects.create(key=f"base:{TINY}", model=TINY, served_model=TINY, status=ServerStatus.RUNNING,
                                            url=engine, token="engine-token", generation=1, handle={"workdir": "/nonexistent"})
    Deployment.objects.create(
        organization=owner.organization, project=owner.project, name=NAME, base_model=TINY, server=server,
        status=DeploymentStatus.READY, source_type=SourceType.MODEL, source_id=TINY, mode=ServingMode.BASE,
    )
    stack.start_web()
    try:
        yield stack
    finally:
        stack.stop()


def prime(lab: LabStack, home: Path, *argv: str, key: str) -> subprocess.CompletedProcess:
    """Run ``prime --plain ARGV`` as a user would, its inference URL Lab's OpenAI-compatible API."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PRIME_", "LAB_"))}
    env.update(
        HOME=str(home), PRIME_INFERENCE_URL=f"{lab.base_url}/api/v1/openai/v1", PRIME_API_KEY=key,
        PRIME_DISABLE_VERSION_CHECK="1", NO_COLOR="1", COLUMNS="200",
    )
    return subprocess.run([str(PRIME), "--plain", *argv], env=env, capture_output=True, text=True, timeout=120)


def test_prime_inference_lists_and_chats_with_the_organizations_deployments(lab, owner, outsider, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    expected = openai.OpenAI(base_url=f"{lab.base_url}/api/v1/openai/v1", api_key=owner.key).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "abc"}], max_tokens=5, temperature=0,
    ).choices[0].message.content
    assert expected

    listed = prime(lab, home, "inference", "models", key=owner.key)
    listed_json = prime(lab, home, "inference", "models", "--output", "json", key=owner.key)
    whole = prime(lab, home, "inference", "chat", NAME, "abc", "--max-tokens", "5", "-t", "0", "-o", "json", key=owner.key)
    streamed = prime(lab, home, "inference", "chat", NAME, "abc", "--max-tokens", "5", "-t", "0", "--stream", key=owner.key)
    theirs = prime(lab, home, "inference", "chat", NAME, "abc", "--max-tokens", "5", key=outsider.key)
    theirs_listed = prime(lab, home, "inference", "models", key=outsider.key)
    reasoning = prime(lab, home, "inference", "chat", NAME, "abc", "--reasoning-effort", "low", key=owner.key)

    for result in (listed, listed_json, whole, streamed, theirs_listed):
        assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}\n{lab.logs()}"
    assert NAME in listed.stdout and "$" in listed.stdout, listed.stdout
    assert '"id": "tiny-tuned"' in listed_json.stdout and '"input_usd_per_mtok"' in listed_json.stdout, listed_json.stdout
    waiting, _, body = whole.stdout.partition("\n")  # the CLI's --plain spinner says it waits, on stdout
    assert waiting == f"Waiting for {NAME}..."
    answer = json.loads(body)
    assert (answer["model"], answer["choices"][0]["message"]["content"]) == (NAME, expected)
    assert streamed.stdout == expected + "\n"
    assert theirs.returncode == 1
    assert "404" in theirs.stdout and "model_not_found" in theirs.stdout, theirs.stdout
    assert "No models returned." in theirs_listed.stdout
    assert reasoning.returncode == 1 and "400" in reasoning.stdout and "reasoning_effort" in reasoning.stdout, reasoning.stdout
    # One ledger row per request answered (the openai client's, and the CLI's two chats); a
    # stream's is written as it closes, just after the client read its end.
    wait_for(lambda: TokenUsage.objects.unscoped().count() == 3, timeout=10, what="three requests on the ledger")


def test_a_teacher_deployment_is_asked_through_labs_api_as_the_spec_was_resolved(lab, owner, outsider, spec):
    deployment = Deployment.objects.unscoped().get()
    submitted = {**spec, "loss": "sft", "teacher": {"deployment": deployment.public_id, "client": {"api_key_var": "TEACHER_KEY"}}}
    canonical = validate_job_spec(project=owner.project, data=submitted, secret_names={"TEACHER_KEY": owner.key}).canonical
    teacher = parse_spec(canonical).spec.teacher
    assert (teacher.model, teacher.client.base_url) == (NAME, f"{lab.base_url}/api/v1/openai/v1")

    client = TeacherClient.from_spec(teacher, {"TEACHER_KEY": owner.key})
    client.check_model()
    answers = client.complete([{"role": "user", "content": "abc"}], n=2, max_tokens=5, temperature=0, seed=7)
    client.close()

    direct = openai.OpenAI(base_url=teacher.client.base_url, api_key=owner.key).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "abc"}], max_tokens=5, temperature=0, seed=7,
    )
    assert [answer.text for answer in answers] == [direct.choices[0].message.content] * 2
    assert TokenUsage.objects.unscoped().filter(deployment_public_id=deployment.public_id).count() == 2
    # Another organization's key, as a job of theirs would hold: the model is not listed to it.
    with pytest.raises(TeacherRefused, match="does not serve 'tiny-tuned'"):
        TeacherClient.from_spec(teacher, {"TEACHER_KEY": outsider.key}).check_model()


def test_an_sft_job_distils_from_a_deployment_through_labs_api(lab, owner, spec, tmp_path):
    """A one-step ``loss = "sft"`` job of the tiny model, its spec as Lab stored it at submit, run by
    the engine (``python -m engine run --offline``: no launcher, the rest as a job runs)."""
    deployment = Deployment.objects.unscoped().get()
    submitted = {
        **spec, "loss": "sft", "max_steps": 1, "checkpoints": {"interval": 0, "keep_last": 1},
        "teacher": {"deployment": deployment.public_id, "client": {"api_key_var": "TEACHER_KEY"},
                    "sampling": {"temperature": 0.0, "max_tokens": 4}},
    }
    canonical = validate_job_spec(project=owner.project, data=submitted, secret_names={"TEACHER_KEY": owner.key}).canonical
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(canonical))
    root = Path(__file__).resolve().parents[2]
    environment = {
        **{name: value for name, value in os.environ.items() if not name.startswith("LAB_")},
        "LAB_MODEL_DIR": str(tmp_path / "models"), "PYTHONPATH": f"{root}{os.pathsep}{root / 'sdk'}", "TEACHER_KEY": owner.key,
    }
    done = subprocess.run(
        [sys.executable, "-m", "engine", "run", "--job-id", "job_1", "--attempt", "1", "--workdir", str(tmp_path / "work"),
         "--spec", str(spec_path), "--offline"],
        cwd=root, env=environment, capture_output=True, text=True, timeout=600,
    )

    assert done.returncode == 0, done.stderr[-3000:] + lab.logs()
    (point,) = [json.loads(line) for line in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(point["values"]["loss/mean"]) and point["values"]["loss/mean"] > 0
    # The teacher's requests went through Lab: one per prompt of the step, each on the ledger once.
    prompts = canonical["batch_size"] // canonical["rollouts_per_example"]
    assert TokenUsage.objects.unscoped().filter(deployment_public_id=deployment.public_id).count() == prompts
