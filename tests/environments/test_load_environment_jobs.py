"""A ``load_environment`` (v0) package's ready build at submit and at launch: ``[[env]] args`` are
checked against ``load_environment``'s recorded parameters, and the launch hands the engine the
build's lock with a wheelhouse URL per wheel (``engine.build_envs`` installs them)."""

from __future__ import annotations

import pytest

from environments.builds import WHEELHOUSE_PREFIX
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from jobs.environment_packages import environment_build_holds, launch_packages
from jobs.models import Job
from lab import storage
from tests.support.environments import push
from tests.support.load_environment_wheels import double_it_wheel, fixture_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

LOCK = [{"name": "verifiers", "version": "0.3.1", "filename": "verifiers-0.3.1-py3-none-any.whl", "sha256": "ab" * 32}]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def _ready(api: str = "v0") -> EnvironmentBuild:
    """Mark the only package's build ready, as the builder records a v0 package's."""
    build = EnvironmentBuild.objects.unscoped().get()
    build.status, build.lock = BuildStatus.READY, LOCK
    build.summary = {
        "api": api,
        "parameters": [{"name": "num_examples", "default": 8, "type": "int", "required": False}],
        "reward_functions": [{"name": "exact", "weight": 1.0}, {"name": "length_penalty", "weight": 0.1}],
    }
    build.save()
    return build


def test_an_argument_load_environment_does_not_take_is_refused_at_submit_naming_those_it_takes(owner, spec):
    assert push(owner, double_it_wheel()).status_code == 201
    _ready()
    client = owner.client()
    spec["env"] = [{"id": "acme/double-it", "args": {"num_examples": 4, "difficulty": "hard"}}]
    refused = client.post("/api/v1/jobs", spec, format="json")
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert error["code"] == "invalid_spec"
    assert [(item["param"], item["code"]) for item in error["errors"]] == [("env.0.args.difficulty", "unknown_key")]
    assert "takes no argument 'difficulty'" in error["message"] and "load_environment takes num_examples" in error["message"]
    spec["env"] = [{"id": "acme/double-it", "args": {"num_examples": 4}}]
    spec["eval"] = {"interval": 1, "env": [{"id": "acme/double-it", "num_examples": 2, "args": {"split": "test"}}]}
    assert client.post("/api/v1/jobs", spec, format="json").status_code == 201  # an eval block's split is Lab's own


def test_the_launch_hands_the_engine_a_v0_build_with_a_wheelhouse_url_per_wheel(owner, spec):
    push(owner, double_it_wheel())
    build = _ready()
    spec["env"] = [{"id": "acme/double-it"}]
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201
    (package,) = launch_packages(Job.objects.unscoped().get())
    row = EnvironmentPackage.objects.unscoped().get()
    assert package["url"] == storage.path_of(row.storage_key).as_uri()
    wheel = storage.path_of(f"{WHEELHOUSE_PREFIX}{LOCK[0]['sha256']}/{LOCK[0]['filename']}").as_uri()
    assert package["build"] == {"number": build.number, "api": "v0", "lock": [{**LOCK[0], "url": wheel}], "secrets": [], "datasets": [], "hub_datasets": None}


def test_a_package_whose_build_is_not_v0_or_not_ready_launches_as_before(owner, spec):
    push(owner, double_it_wheel())
    spec["env"] = [{"id": "acme/double-it", "args": {"anything": 1}}]  # no ready build: nothing to check against yet
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201
    job = Job.objects.unscoped().get()
    assert "build" not in launch_packages(job)[0]
    _ready(api="v1")
    assert "build" not in launch_packages(job)[0]


def _ready_judge() -> EnvironmentBuild:
    """Mark the only package's build ready as the builder records ``judge-qa``'s: its judge's key,
    named by a parameter, declared with ``vf.ensure_keys``."""
    build = EnvironmentBuild.objects.unscoped().get()
    build.status, build.lock = BuildStatus.READY, LOCK
    build.summary = {
        "api": "v0",
        "parameters": [
            {"name": "judge_base_url", "default": "https://api.openai.com/v1", "type": "str", "required": False},
            {"name": "judge_api_key_var", "default": "JUDGE_API_KEY", "type": "str", "required": False},
        ],
        "reward_functions": [{"name": "judged", "weight": 1.0}],
        "secrets": ["JUDGE_API_KEY"],
    }
    build.save()
    return build


def test_a_secret_the_environment_reads_is_required_at_submit_under_the_name_its_arguments_give(owner, spec):
    assert push(owner, fixture_wheel("judge-qa")).status_code == 201
    _ready_judge()
    client = owner.client()
    spec["env"] = [{"id": "acme/judge-qa"}]
    refused = client.post("/api/v1/jobs", spec, format="json")
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert [(item["param"], item["code"]) for item in error["errors"]] == [("env.0.id", "missing_secret")]
    assert error["errors"][0]["message"] == (
        "environment 'acme/judge-qa@0.1.0' reads the secret JUDGE_API_KEY (it declares it with vf.ensure_keys, or makes an "
        "OpenAI client on it), which the job is not given (given: none): pass each as a job secret, with -e JUDGE_API_KEY=... "
        "or an env file, or as secrets.JUDGE_API_KEY in the request"
    )
    assert not Job.objects.unscoped().exists()
    assert client.post("/api/v1/jobs", {**spec, "secrets": {"JUDGE_API_KEY": "sk-judge"}}, format="json").status_code == 201
    # The judge's key named by its argument: that name is the secret it reads.
    spec["env"] = [{"id": "acme/judge-qa", "args": {"judge_api_key_var": "TEAM_JUDGE_KEY"}}]
    renamed = client.post("/api/v1/jobs", {**spec, "secrets": {"JUDGE_API_KEY": "sk-judge"}}, format="json")
    assert renamed.status_code == 400 and "reads the secret TEAM_JUDGE_KEY" in renamed.json()["error"]["message"]
    assert "(given: JUDGE_API_KEY)" in renamed.json()["error"]["message"]
    assert client.post("/api/v1/jobs", {**spec, "secrets": {"TEAM_JUDGE_KEY": "sk-team"}}, format="json").status_code == 201


def test_the_launch_names_only_the_secrets_the_environment_reads(owner, spec):
    push(owner, fixture_wheel("judge-qa"))
    _ready_judge()
    spec["env"] = [{"id": "acme/judge-qa"}]
    body = {**spec, "secrets": {"JUDGE_API_KEY": "sk-judge", "WANDB_API_KEY": "w-secret"}}
    assert owner.client().post("/api/v1/jobs", body, format="json").status_code == 201
    (package,) = launch_packages(Job.objects.unscoped().get())
    assert package["build"]["secrets"] == ["JUDGE_API_KEY"]


def test_a_job_whose_build_turns_ready_reading_a_secret_it_lacks_fails_naming_it_and_one_given_it_may_start(owner, spec):
    push(owner, fixture_wheel("judge-qa"))
    spec["env"] = [{"id": "acme/judge-qa"}]
    client = owner.client()
    lacking = client.post("/api/v1/jobs", spec, format="json").json()["id"]  # the build is queued: nothing to check yet
    given = client.post("/api/v1/jobs", {**spec, "secrets": {"JUDGE_API_KEY": "sk-judge"}}, format="json").json()["id"]
    jobs = {job.public_id: job.pk for job in Job.objects.unscoped().all()}
    assert environment_build_holds(list(jobs.values())) == (set(jobs.values()), {})
    _ready_judge()
    building, failed = environment_build_holds(list(jobs.values()))
    assert building == set() and jobs[given] not in failed
    assert failed == {jobs[lacking]: (
        "environment 'acme/judge-qa@0.1.0' reads the secret JUDGE_API_KEY (it declares it with vf.ensure_keys, or makes an "
        "OpenAI client on it), which the job is not given (given: none): pass each as a job secret, with -e JUDGE_API_KEY=... "
        "or an env file, or as secrets.JUDGE_API_KEY in the request"
    )}
