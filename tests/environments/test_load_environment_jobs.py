"""A ``load_environment`` (v0) package's ready build at submit and at launch: ``[[env]] args`` are
checked against ``load_environment``'s recorded parameters, and the launch hands the engine the
build's lock with a wheelhouse URL per wheel (``engine.build_envs`` installs them)."""

from __future__ import annotations

import pytest

from environments.builds import WHEELHOUSE_PREFIX
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from jobs.environment_packages import launch_packages
from jobs.models import Job
from lab import storage
from tests.environments.load_environment_wheels import double_it_wheel
from tests.support.environments import push

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
    assert package["build"] == {"number": build.number, "api": "v0", "lock": [{**LOCK[0], "url": wheel}]}


def test_a_package_whose_build_is_not_v0_or_not_ready_launches_as_before(owner, spec):
    push(owner, double_it_wheel())
    spec["env"] = [{"id": "acme/double-it", "args": {"anything": 1}}]  # no ready build: nothing to check against yet
    assert owner.client().post("/api/v1/jobs", spec, format="json").status_code == 201
    job = Job.objects.unscoped().get()
    assert "build" not in launch_packages(job)[0]
    _ready(api="v1")
    assert "build" not in launch_packages(job)[0]
