"""Builds of an environment that loads its dataset by name (``load_dataset("acme/arith")``) run
offline: without a pushed ``acme/arith`` the build fails naming ``lab datasets push``; once it is
pushed, a rebuild loads it through the real ``datasets`` library, and a job's launch carries it.
Builds resolve against the local package index (``make package-index``), never a remote one."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from environments.builds import build_again, build_log, build_run, latest_build
from environments.models import BuildStatus, DatasetSnapshot, EnvironmentPackage
from jobs.environment_packages import launch_packages
from jobs.models import Job
from lab import storage
from tests.support.environments import push
from tests.support.load_environment_wheels import ARITH_ROWS, arith_by_name_wheel
from tests.support.packages import local_index_url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker"), pytest.mark.system]



@pytest.fixture
def index(settings, tmp_path) -> str:
    """The local package index as LAB_PACKAGE_INDEX_URL, an empty storage for this test, and builds
    that fetch nothing from the Hugging Face Hub (test_hub_datasets_builds.py has those)."""
    settings.LAB_PACKAGE_INDEX_URL = local_index_url()
    settings.LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES = 0
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    return settings.LAB_PACKAGE_INDEX_URL


def test_a_build_loading_an_unpushed_dataset_fails_naming_lab_datasets_push_and_builds_once_it_is_pushed(owner, index, spec):
    response = push(owner, arith_by_name_wheel())
    assert response.status_code == 201, response.content
    package = EnvironmentPackage.objects.unscoped().get(name="arith-by-name")

    failed = build_run(latest_build(package).pk)
    assert failed.status == BuildStatus.FAILED, build_log(failed)
    assert failed.error == (
        'loading it calls load_dataset("acme/arith"), and Lab loads environments offline, where a dataset named so is one '
        "the organization pushed: push its files with `lab datasets push acme/arith DIR|FILE` (a folder such as the dataset's "
        "repository: train.jsonl, data/test-00000.parquet, ...), then build the environment again (`lab envs rebuild ID`)"
    )
    assert "Couldn't reach 'acme/arith' on the Hub" in build_log(failed)  # datasets' own error, in the log

    pushed = owner.client().post(
        "/api/v1/datasets", {"name": "acme/arith", "file": SimpleUploadedFile("train.jsonl", ARITH_ROWS.encode())}, format="multipart",
    )
    assert pushed.status_code == 201, pushed.content
    ready = build_run(build_again(package).pk)
    assert ready.status == BuildStatus.READY, build_log(ready)
    assert ready.summary["dataset_size"] == 12  # the pushed rows, read by the real datasets library
    assert [(function["name"], function["weight"]) for function in ready.summary["reward_functions"]][:2] == [("correct", 1.0), ("brief", 0.2)]
    assert "pushed datasets load_dataset finds by name: acme/arith" in build_log(ready)

    submitted = owner.client().post("/api/v1/jobs", {**spec, "env": [{"id": "acme/arith-by-name"}]}, format="json")
    assert submitted.status_code == 201, submitted.content
    (launched,) = launch_packages(Job.objects.unscoped().get())
    snapshot = DatasetSnapshot.objects.unscoped().get()
    assert launched["build"]["datasets"] == [
        {"id": "acme/arith", "sha256": snapshot.sha256, "url": storage.path_of(snapshot.storage_key).as_uri()}
    ]
