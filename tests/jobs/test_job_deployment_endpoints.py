"""A job's ``[teacher]`` and an environment's ``judge`` naming a deployment (jobs/specs.py
``_deployment_problems``): resolved at submit to Lab's own OpenAI-compatible API under the
deployment's name, the key a job secret; another organization's deployment refused exactly as a
missing one, a stopped one refused saying so, and nothing created by a refused submit."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from environments.models import BuildStatus, EnvironmentBuild
from jobs.models import Job
from serving.models import Deployment, DeploymentStatus, ServingMode, SourceType
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

TINY = "lab/tiny-random-llama"
KEY = "lab-key-4f9c2e7a1b"


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    settings.LAB_PUBLIC_URL = "https://lab.example"


def deployment(tenant, name: str = "tiny-tuned", status: str = DeploymentStatus.READY, reason: str = "") -> Deployment:
    return Deployment.objects.create(
        organization=tenant.organization, project=tenant.project, name=name, base_model=TINY, source_type=SourceType.MODEL,
        source_id=TINY, mode=ServingMode.BASE, status=status, status_reason=reason,
    )


def sft(spec: dict, teacher: dict) -> dict:
    return {**spec, "loss": "sft", "teacher": teacher}


def create(tenant, spec: dict, secrets: dict):
    return tenant.client().post("/api/v1/jobs", {**spec, "secrets": secrets}, format="json")


def errors(response) -> list[tuple[str, str]]:
    return [(item["param"], item["code"]) for item in response.json()["error"]["errors"]]


def test_a_teacher_deployment_is_resolved_to_labs_openai_api_under_its_name(owner, spec):
    mine = deployment(owner)
    teacher = {"deployment": mine.public_id, "client": {"api_key_var": "TEACHER_KEY"}}

    response = create(owner, sft(spec, teacher), {"TEACHER_KEY": KEY})

    assert response.status_code == 201, response.content
    job = Job.objects.unscoped().get()
    assert job.spec["teacher"] == {
        "model": "tiny-tuned", "deployment": mine.public_id,
        "client": {"base_url": "https://lab.example/api/v1/openai/v1", "api_key_var": "TEACHER_KEY"},
    }
    # The stored spec submits again as it is.
    again = create(owner, {key: value for key, value in job.spec.items() if key != "translated_from"}, {"TEACHER_KEY": KEY})
    assert again.status_code == 201, again.content
    assert Job.objects.unscoped().latest("pk").spec["teacher"] == job.spec["teacher"]


def test_another_organizations_deployment_is_refused_exactly_as_a_missing_one(owner, outsider, spec):
    theirs = deployment(outsider)
    answers = []
    for deployment_id in (theirs.public_id, "dep_doesnotexist"):
        teacher = {"deployment": deployment_id, "client": {"api_key_var": "TEACHER_KEY"}}
        response = create(owner, sft(spec, teacher), {"TEACHER_KEY": KEY})
        assert response.status_code == 400, response.content
        assert errors(response) == [("teacher.deployment", "unknown_deployment")]
        answers.append(response.json()["error"]["message"].replace(deployment_id, "ID"))
    assert answers[0] == answers[1] == "teacher.deployment: no deployment 'ID' in this project"
    assert Job.objects.unscoped().count() == 0


def test_a_stopped_or_failed_deployment_is_refused_saying_so(owner, spec):
    stopped = deployment(owner, status=DeploymentStatus.STOPPED)
    failed = deployment(owner, name="broken", status=DeploymentStatus.FAILED, reason="the weights did not load")
    for row, said in ((stopped, "is stopped;"), (failed, "is failed (the weights did not load);")):
        response = create(owner, sft(spec, {"deployment": row.public_id, "client": {"api_key_var": "K"}}), {"K": KEY})
        assert response.status_code == 400, response.content
        assert errors(response) == [("teacher.deployment", "deployment_not_active")]
        assert f"deployment '{row.public_id}' {said} only a pending, deploying or ready one can be called" in response.json()["error"]["message"]
    assert Job.objects.unscoped().count() == 0


def test_a_teacher_deployment_needs_its_key_and_keeps_no_other_model_or_url(owner, spec):
    mine = deployment(owner)
    no_client = create(owner, sft(spec, {"deployment": mine.public_id}), {})
    no_secret = create(owner, sft(spec, {"deployment": mine.public_id, "client": {"api_key_var": "TEACHER_KEY"}}), {})
    other_model = create(owner, sft(spec, {"deployment": mine.public_id, "model": "gpt-4o", "client": {"api_key_var": "K"}}), {"K": KEY})
    other_url = create(
        owner, sft(spec, {"deployment": mine.public_id, "client": {"api_key_var": "K", "base_url": "https://elsewhere/v1"}}), {"K": KEY},
    )
    no_model = create(owner, sft(spec, {"client": {"api_key_var": "K", "base_url": "https://elsewhere/v1"}}), {"K": KEY})
    no_url = create(owner, sft(spec, {"model": "gpt-4o", "client": {"api_key_var": "K"}}), {"K": KEY})

    assert errors(no_client) == [("teacher.client.api_key_var", "required")]
    assert errors(no_secret) == [("teacher.client.api_key_var", "missing_secret")]
    assert errors(other_model) == [("teacher.model", "conflicting_keys")]
    assert "is called as 'tiny-tuned'" in other_model.json()["error"]["message"]
    assert errors(other_url) == [("teacher.client.base_url", "conflicting_keys")]
    assert errors(no_model) == [("teacher.model", "required")]
    assert errors(no_url) == [("teacher.client.base_url", "required")]
    assert Job.objects.unscoped().count() == 0


def judge_qa_wheel() -> tuple[str, bytes]:
    """``judge-qa`` (tests/environments/fixtures/judge-qa) as a wheel: a load_environment package
    that takes Prime's three judge arguments."""
    root = Path(__file__).resolve().parents[1] / "environments" / "fixtures" / "judge-qa"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return build_wheel(project["name"], project["version"], files={"judge_qa.py": (root / "judge_qa.py").read_text()},
                       requires=project["dependencies"])


def _ready_judge_build() -> None:
    """Mark the only package's build ready as the builder records ``judge-qa``'s: Prime's three
    judge arguments, and its judge's key named by one of them."""
    build = EnvironmentBuild.objects.unscoped().get()
    build.status = BuildStatus.READY
    build.lock = [{"name": "verifiers", "version": "0.3.1", "filename": "verifiers-0.3.1-py3-none-any.whl", "sha256": "ab" * 32}]
    build.summary = {
        "api": "v0",
        "parameters": [
            {"name": "judge_model", "default": "gpt-4.1-mini", "type": "str", "required": False},
            {"name": "judge_base_url", "default": "https://api.openai.com/v1", "type": "str", "required": False},
            {"name": "judge_api_key_var", "default": "JUDGE_API_KEY", "type": "str", "required": False},
        ],
        "reward_functions": [{"name": "judged", "weight": 1.0}],
        "secrets": ["JUDGE_API_KEY"],
    }
    build.save()


def test_an_environments_judge_deployment_becomes_its_judge_arguments_and_the_key_a_secret(owner, outsider, spec):
    assert push(owner, judge_qa_wheel()).status_code == 201
    _ready_judge_build()
    mine, theirs = deployment(owner), deployment(outsider)
    spec["env"] = [{"id": "acme/judge-qa", "judge": {"deployment": mine.public_id, "api_key_var": "JUDGE_KEY"}}]

    missing_key = create(owner, spec, {})
    accepted = create(owner, spec, {"JUDGE_KEY": KEY})
    # Unresolved, the environment reads its default key: given too, so that only the judge is refused.
    both = {"JUDGE_KEY": KEY, "JUDGE_API_KEY": KEY}
    spec["env"][0]["judge"]["deployment"] = theirs.public_id
    refused = create(owner, spec, both)
    spec["env"][0] = {**spec["env"][0], "judge": {"deployment": mine.public_id, "api_key_var": "JUDGE_KEY"}, "args": {"judge_model": "x"}}
    clash = create(owner, spec, both)

    assert ("env.0.judge.api_key_var", "missing_secret") in errors(missing_key)
    assert accepted.status_code == 201, accepted.content
    (block,) = Job.objects.unscoped().get().spec["env"]
    assert block["args"] == {
        "judge_model": "tiny-tuned", "judge_base_url": "https://lab.example/api/v1/openai/v1", "judge_api_key_var": "JUDGE_KEY",
    }
    assert block["judge"] == {"deployment": mine.public_id, "api_key_var": "JUDGE_KEY"}
    assert errors(refused) == [("env.0.judge.deployment", "unknown_deployment")]
    assert errors(clash) == [("env.0.args.judge_model", "conflicting_keys")]
    assert Job.objects.unscoped().count() == 1


def test_a_judge_endpoint_the_job_declares_becomes_its_judge_arguments(owner, spec):
    assert push(owner, judge_qa_wheel()).status_code == 201
    _ready_judge_build()
    judge = {"base_url": "https://judge.example:8443/v1", "model": "grader", "api_key_var": "JUDGE_KEY"}
    spec["env"] = [{"id": "acme/judge-qa", "judge": judge}]

    missing_key = create(owner, spec, {})
    accepted = create(owner, spec, {"JUDGE_KEY": KEY})
    # Unresolved, the environment reads its default key: given too, so that only the judge is refused.
    given = {"JUDGE_KEY": KEY, "JUDGE_API_KEY": KEY}
    spec["env"][0] = {**spec["env"][0], "args": {"judge_base_url": "https://elsewhere.example/v1"}}
    clash = create(owner, spec, given)
    spec["env"][0] = {"id": "acme/judge-qa", "judge": {**judge, "deployment": "dep_1"}}
    both = create(owner, spec, given)
    spec["env"][0] = {"id": "acme/judge-qa", "judge": {"model": "grader"}}
    neither = create(owner, spec, given)
    spec["env"][0] = {"id": "acme/judge-qa", "judge": {"base_url": "judge.example/v1"}}
    not_a_url = create(owner, spec, given)

    assert ("env.0.judge.api_key_var", "missing_secret") in errors(missing_key)
    assert accepted.status_code == 201, accepted.content
    (block,) = Job.objects.unscoped().get().spec["env"]
    assert block["args"] == {"judge_model": "grader", "judge_base_url": "https://judge.example:8443/v1", "judge_api_key_var": "JUDGE_KEY"}
    assert block["judge"] == judge
    assert errors(clash) == [("env.0.args.judge_base_url", "conflicting_keys")]
    assert "judge 'https://judge.example:8443/v1' is called as" in clash.json()["error"]["message"]
    assert errors(both) == errors(neither) == [("env.0.judge.base_url", "required")]
    assert errors(not_a_url) == [("env.0.judge.base_url", "invalid_value")]
    assert Job.objects.unscoped().count() == 1
