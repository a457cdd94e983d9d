"""Builds of an environment that loads a Hugging Face Hub dataset by name (``load_dataset
("someorg/tiny-math")``) fetch it from the hub at ``LAB_HF_ENDPOINT`` (a local stand-in,
``HubServer``) through the real ``datasets`` library, and keep what was fetched beside the build:
one tar in storage, its size in the summary, handed to a job's launch; past
``LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES`` the build fails naming it. The engine unpacks the tar
as a Hugging Face cache that the build's own ``datasets`` loads offline, asking no hub. An
environment with an eval dataset only builds, and a training job naming it is a 400 while an
evaluation of it is taken. Builds resolve against the local package index (``make package-index``), never a remote one."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from engine import build_envs, dataset_snapshots
from engine.environments.base import InvalidEnvironment
from environments import hub_datasets
from environments.builds import build_again, build_log, build_run, latest_build
from environments.models import BuildStatus, EnvironmentPackage
from jobs.environment_packages import environment_build_holds, launch_packages, no_train_dataset_message
from jobs.models import Job
from lab import storage
from tests.support.environments import push
from tests.support.evaluations import evaluation_body
from tests.support.hub_datasets import (
    TINY_MATH,
    TINY_MATH_COMMIT,
    eval_only_wheel,
    tiny_math_repository,
    tiny_math_wheel,
)
from tests.support.model_dirs import HubServer
from tests.support.packages import local_index_url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker"), pytest.mark.system]


@pytest.fixture
def index(settings, tmp_path) -> str:
    """The local package index as LAB_PACKAGE_INDEX_URL, and an empty storage for this test."""
    settings.LAB_PACKAGE_INDEX_URL = local_index_url()
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    return settings.LAB_PACKAGE_INDEX_URL


@pytest.fixture
def hub(settings, tmp_path):
    """The stand-in hub serving ``someorg/tiny-math``, as LAB_HF_ENDPOINT."""
    with HubServer() as server:
        server.add(TINY_MATH, tiny_math_repository(tmp_path / "tiny-math"), commit=TINY_MATH_COMMIT, repo_type="dataset")
        settings.LAB_HF_ENDPOINT = server.url
        yield server


def _read(url: str):
    with open(url.removeprefix("file://"), "rb") as handle:
        yield handle.read()


def test_a_build_fetches_the_hub_dataset_loading_asks_for_keeps_it_and_a_job_loads_it_offline(owner, index, hub, spec, tmp_path):
    assert push(owner, tiny_math_wheel()).status_code == 201
    package = EnvironmentPackage.objects.unscoped().get(name="tiny-math-env")

    build = build_run(latest_build(package).pk)
    assert build.status == BuildStatus.READY, build_log(build)
    assert (build.summary["dataset_size"], build.summary["train_dataset"]) == (8, True)  # the train split's rows, fetched from the hub
    fetched = build.summary["hub_datasets"]
    assert fetched["repositories"] == [TINY_MATH]
    assert fetched["files"] >= 2 and 0 < fetched["size_bytes"] < 1_000_000
    key = hub_datasets.key(package.organization.public_id, fetched["sha256"])
    assert storage.stored_size_and_sha256(key) == (fetched["size_bytes"], fetched["sha256"])
    downloads = sorted(request for request in hub.requests if request.startswith("GET /datasets/"))
    assert downloads == [f"GET /datasets/{TINY_MATH}/resolve/{TINY_MATH_COMMIT}/data/{split}.jsonl" for split in ("test", "train")]
    assert f"Hugging Face datasets from {hub.url}" in build_log(build)
    assert f"Hugging Face datasets loading fetched: {TINY_MATH}" in build_log(build)

    submitted = owner.client().post("/api/v1/jobs", {**spec, "env": [{"id": "acme/tiny-math-env"}]}, format="json")
    assert submitted.status_code == 201, submitted.content
    (launched,) = launch_packages(Job.objects.unscoped().get())
    assert launched["build"]["hub_datasets"] == {"sha256": fetched["sha256"], "url": storage.path_of(key).as_uri()}

    # The engine's side: unpacked as HF_HOME, the build's own datasets loads the split offline, asking no hub.
    home = dataset_snapshots.unpack_hub_datasets(launched["build"]["hub_datasets"], tmp_path / "attempt", _read, package_id="p")
    assert home == tmp_path / "attempt" / "environments" / "hf" / fetched["sha256"]
    asked = len(hub.requests)
    python, _ = build_envs.ensure_environment("acme/tiny-math-env@0.1.0", launched["build"]["lock"], tmp_path / "attempt", _copy_wheel)
    loaded = subprocess.run(
        [str(python), "-c", f"import datasets; print(len(datasets.load_dataset('{TINY_MATH}', split='train')))"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
             "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": hub.url},
        capture_output=True, text=True, timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split()[-1] == "8"
    assert len(hub.requests) == asked


def _copy_wheel(entry: dict, folder: Path) -> Path:
    target = folder / entry["filename"]
    shutil.copyfile(entry["url"].removeprefix("file://"), target)
    return target


def test_a_build_fetching_more_than_the_limit_fails_naming_it_and_keeps_nothing(owner, index, hub, settings):
    settings.LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES = 100
    assert push(owner, tiny_math_wheel()).status_code == 201
    package = EnvironmentPackage.objects.unscoped().get(name="tiny-math-env")

    failed = build_run(latest_build(package).pk)
    assert failed.status == BuildStatus.FAILED, build_log(failed)
    assert failed.error.startswith(f"loading it fetched 0.0 MB of Hugging Face datasets ({TINY_MATH}), more than builds keep (0.0 MB, ")
    assert "LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES" in failed.error
    assert [key for key, _ in storage.iter_objects(hub_datasets.PREFIX)] == []

    del settings.LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES
    ready = build_run(build_again(package).pk)
    assert ready.status == BuildStatus.READY, build_log(ready)


def test_a_build_with_the_hub_switched_off_loads_offline_and_fails_naming_the_fix(owner, index, hub, settings):
    settings.LAB_ENVIRONMENT_HUB_DATASETS_MAX_BYTES = 0
    assert push(owner, tiny_math_wheel()).status_code == 201
    package = EnvironmentPackage.objects.unscoped().get(name="tiny-math-env")

    failed = build_run(latest_build(package).pk)
    assert failed.status == BuildStatus.FAILED
    assert failed.error.startswith(f'loading it calls load_dataset("{TINY_MATH}"), and Lab loads environments offline')
    assert hub.requests == []


def test_a_build_naming_a_dataset_the_hub_lacks_fails_naming_the_hub_and_lab_datasets_push(owner, index, settings):
    with HubServer() as empty:
        settings.LAB_HF_ENDPOINT = empty.url
        assert push(owner, tiny_math_wheel()).status_code == 201
        failed = build_run(latest_build(EnvironmentPackage.objects.unscoped().get(name="tiny-math-env")).pk)
    assert failed.status == BuildStatus.FAILED
    assert failed.error.startswith(
        f'loading it calls load_dataset("{TINY_MATH}"), which is neither a dataset the organization pushed nor one the build '
        f"could fetch from {empty.url} (the log has its answer): push its files with `lab datasets push {TINY_MATH} DIR|FILE`"
    )


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


@pytest.mark.parametrize("problem", ["link_out", "sha256"])
def test_the_engine_refuses_a_hub_datasets_tar_with_a_link_out_or_another_sha256(tmp_path, problem):
    link = tarfile.TarInfo("hub/datasets--a--b/snapshots/c/train.jsonl")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../../../../etc/passwd"
    data = _tar((link, None))
    sha256 = hashlib.sha256(data).hexdigest() if problem == "link_out" else "0" * 64
    with pytest.raises(InvalidEnvironment) as refused:
        dataset_snapshots.unpack_hub_datasets({"sha256": sha256, "url": "x"}, tmp_path, lambda url: iter([data]), package_id="acme/e@1")
    assert str(refused.value).startswith("package acme/e@1: ")
    assert not (tmp_path / "etc").exists()
    assert list((tmp_path / "environments" / "hf").glob("*/.lab-unpacked")) == []


def test_an_environment_with_an_eval_dataset_only_builds_evaluates_and_is_refused_for_training(owner, index, spec):
    assert push(owner, eval_only_wheel()).status_code == 201
    package = EnvironmentPackage.objects.unscoped().get(name="sums-benchmark")
    early = owner.client().post("/api/v1/jobs", {**spec, "env": [{"id": "acme/sums-benchmark"}]}, format="json")
    assert early.status_code == 201, early.content  # its build is still queued: admission checks it once ready
    build = build_run(latest_build(package).pk)
    assert build.status == BuildStatus.READY, build_log(build)
    assert (build.summary["dataset_size"], build.summary["eval_dataset_size"], build.summary["train_dataset"]) == (None, 4, False)
    assert build.summary["rollout"]["examples"] > 0  # the smoke rollout ran on the eval dataset

    refused = owner.client().post("/api/v1/jobs", {**spec, "env": [{"id": "acme/sums-benchmark"}]}, format="json")
    assert refused.status_code == 400, refused.content
    assert [(error["param"], error["code"]) for error in refused.json()["error"]["errors"]] == [("env.0.id", "no_train_dataset")]
    assert refused.json()["error"]["message"].startswith(
        "env.0.id: environment 'acme/sums-benchmark@0.1.0' has no train dataset: its load_environment returns an environment "
        "with an eval_dataset only, which evaluations use"
    )
    assert Job.objects.unscoped().count() == 1
    early_job = Job.objects.unscoped().get()
    assert environment_build_holds([early_job.pk]) == (set(), {early_job.pk: no_train_dataset_message("acme/sums-benchmark@0.1.0")})

    evaluation = evaluation_body(environments=[{"id": "acme/sums-benchmark", "num_examples": 2}])
    created = owner.client().post("/api/v1/evaluations", evaluation, format="json")
    assert created.status_code == 201, created.content
    (launched,) = launch_packages(Job.objects.unscoped().get(public_id=created.json()["job_id"]))
    assert launched["build"]["number"] == build.number
