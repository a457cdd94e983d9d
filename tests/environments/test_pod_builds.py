"""Environment builds on the Kubernetes pool (environments.pod_builds, jobs.launchers.kubernetes.builds):
a batch Job per build in the engine image, on the in-memory cluster (tests/support/fake_build_jobs.py),
its pod played by running the manifest's own containers as local subprocesses against a live Lab
and the local package index (``make package-index``)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from django.test import Client

from environments import pod_builds
from environments.builds import build_log, latest_build
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.tasks import build_environment, sweep_environment_builds
from jobs.launchers import registry
from jobs.launchers.kubernetes.builds import build_job_name
from jobs.launchers.kubernetes.kinds import JOB
from tests.support.environments import push
from tests.support.fake_build_jobs import BuildJobsGateway, run_build_pod
from tests.support.wheelbuilder import lab_wheel

pytestmark = [pytest.mark.django_db]
NAMESPACE = "lab-builds"
PACKAGE_INDEX = Path(__file__).resolve().parents[2] / "var" / "package-index"


@pytest.fixture
def index(settings, tmp_path) -> str:
    """The local package index as LAB_PACKAGE_INDEX_URL, and an empty storage for this test."""
    if not (PACKAGE_INDEX / ".filled").is_file():
        pytest.fail("the local package index is missing: run `make package-index` (once; it downloads from PyPI)")
    settings.LAB_PACKAGE_INDEX_URL = (PACKAGE_INDEX / "simple").as_uri()
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }
    return settings.LAB_PACKAGE_INDEX_URL


@pytest.fixture
def cluster(settings, monkeypatch, index) -> BuildJobsGateway:
    """Lab on the Kubernetes pool (``LAB_LAUNCHER=kubernetes``) whose launcher's gateway is an in-memory cluster."""
    gateway = BuildJobsGateway()
    settings.LAB_LAUNCHER = "kubernetes"
    settings.LAB_ENGINE_IMAGE = "registry.example/lab-engine:7"
    monkeypatch.setattr(registry, "get_launcher", lambda: SimpleNamespace(gateway=gateway))
    return gateway


def _queued(owner, wheel) -> EnvironmentBuild:
    response = push(owner, wheel)
    assert response.status_code == 201, response.content
    return latest_build(EnvironmentPackage.objects.unscoped().get(name=response.json()["name"]))


def _started(owner, wheel) -> EnvironmentBuild:
    build = _queued(owner, wheel)
    build_environment(build.pk)
    build.refresh_from_db()
    assert build.status == BuildStatus.RUNNING
    return build


def test_a_build_on_the_pool_runs_the_builder_in_a_job_and_ends_ready_with_its_wheels_and_log_stored_through_lab(
    owner, cluster, live_server, settings, tmp_path,
):
    settings.LAB_PUBLIC_URL = live_server.url
    build = _started(owner, lab_wheel("idna-env", extra_requires=("idna",)))
    name = build_job_name(build.pk)
    job = cluster.get(JOB, name, NAMESPACE)
    spec = job["spec"]["template"]["spec"]
    fetch, builder = spec["initContainers"]
    [report] = spec["containers"]

    assert job["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "lab", "app.kubernetes.io/component": "environment-build",
                                         "lab.dev/environment-build": str(build.pk), "lab.dev/organization": "acme"}
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S + 300)
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
    assert {container["image"] for container in (fetch, builder, report)} == {"registry.example/lab-engine:7"}
    assert builder["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    # the builder's own arguments, as the worker's subprocess gets them, for the pod's paths
    assert builder["args"][builder["args"].index("--") + 1:][:5] == ["python", "-m", "environments.builder", "build", "--wheel"]
    assert "--sandbox" in builder["args"] and builder["args"][builder["args"].index("--sandbox") + 1] == "none"
    # only the steps that talk to Lab get the token; the one that runs the package's code has none
    assert [entry["name"] for entry in builder["env"]] == ["HOME", "PYTHONUNBUFFERED", "LANG"]
    assert all(any(entry["name"] == "LAB_BUILD_TOKEN" for entry in container["env"]) for container in (fetch, report))
    secret = cluster.objects[("Secret", NAMESPACE, name)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"] and secret["immutable"] is True

    # the task delivered again: the build is not queued, nothing is created again
    assert build_environment(build.pk) is None and len([key for key in cluster.objects if key[0] == "Job"]) == 1
    sweep_environment_builds()
    assert EnvironmentBuild.objects.unscoped().get(pk=build.pk).status == BuildStatus.RUNNING  # its Job runs

    exit_codes, outputs = run_build_pod(cluster, NAMESPACE, name, tmp_path / "pod")
    assert exit_codes == {"fetch": 0, "build": 0, "report": 0}, outputs
    assert sweep_environment_builds()["ended"] == 1

    build.refresh_from_db()
    assert build.status == BuildStatus.READY, (build.error, build_log(build))
    [idna] = build.lock
    assert idna["name"] == "idna"
    stored = settings.STORAGES["checkpoints"]["OPTIONS"]["location"]
    wheel = tmp_path / "store" / "environments" / "wheelhouse" / idna["sha256"] / idna["filename"]
    assert str(wheel).startswith(stored) and hashlib.sha256(wheel.read_bytes()).hexdigest() == idna["sha256"]
    assert build.summary["api"] == "lab" and "smoke rollout of 2 examples" in build_log(build)
    assert "1 wheels uploaded" in outputs["report"]


def _callback(build: EnvironmentBuild, path: str, *, token: str | None, method: str = "get", data: bytes = b""):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    url = f"/api/v1/environment-builds/{build.pk}/{path}"
    if method == "put":
        return Client().put(url, data=data, content_type="application/octet-stream", **headers)
    return getattr(Client(), method)(url, **headers)


def test_a_builds_token_opens_only_that_running_build_and_the_wheelhouse_takes_only_what_its_digest_names(owner, cluster, settings):
    build = _started(owner, lab_wheel("one-env"))
    other = _started(owner, lab_wheel("two-env"))
    token = pod_builds.build_token(build)
    body = b"not really a wheel"
    digest = hashlib.sha256(body).hexdigest()

    assert _callback(build, "wheel", token=None).status_code == 401
    assert _callback(build, "wheel", token=pod_builds.build_token(other)).status_code == 401
    assert _callback(build, "wheel", token=token[:-2] + "xx").status_code == 401
    wheel = _callback(build, "wheel", token=token)
    assert wheel.status_code == 200 and b"".join(wheel.streaming_content).startswith(b"PK")

    wrong = _callback(build, f"wheelhouse/{'0' * 64}/x-1.0-py3-none-any.whl", token=token, method="put", data=body)
    assert wrong.status_code == 400 and digest in wrong.content.decode()
    assert _callback(build, f"wheelhouse/{'0' * 64}/x-1.0-py3-none-any.whl", token=token, method="head").status_code == 404
    assert _callback(build, f"wheelhouse/{digest}/../x.whl", token=token, method="put", data=body).status_code in (400, 404)
    assert _callback(build, f"wheelhouse/{digest}/x-1.0-py3-none-any.whl", token=token, method="put", data=body).status_code == 201
    assert _callback(build, f"wheelhouse/{digest}/x-1.0-py3-none-any.whl", token=token, method="head").status_code == 200

    EnvironmentBuild.objects.unscoped().filter(pk=build.pk).update(status=BuildStatus.FAILED)
    assert _callback(build, "wheel", token=token).status_code == 401  # good only while it runs


def _ended(build: EnvironmentBuild) -> EnvironmentBuild:
    sweep_environment_builds()
    build.refresh_from_db()
    return build


def test_an_oom_killed_build_pod_fails_the_build_saying_so_with_its_limit(owner, cluster):
    build = _started(owner, lab_wheel())
    cluster.end_build(NAMESPACE, build_job_name(build.pk), {"fetch": 0, "build": 137}, reasons={"build": "OOMKilled"})

    build = _ended(build)
    assert build.status == BuildStatus.FAILED
    assert build.error.startswith("the build ran out of memory: its pod was OOM-killed at its limit of 8 GiB (LAB_K8S_BUILD_MEMORY_GIB")
    assert build_log(build).strip() == build.error  # the pod stored no log: the log says why


def test_a_build_job_past_its_deadline_fails_as_a_build_past_its_limit(owner, cluster, settings):
    build = _started(owner, lab_wheel())
    cluster.pass_deadline(NAMESPACE, build_job_name(build.pk))

    build = _ended(build)
    assert build.status == BuildStatus.FAILED
    assert f"took longer than {settings.LAB_ENVIRONMENT_BUILD_TIMEOUT_S} s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S)" in build.error


def test_a_deleted_build_job_fails_the_build_once_its_creation_grace_has_passed(owner, cluster):
    build = _started(owner, lab_wheel())
    cluster.delete(JOB, build_job_name(build.pk), NAMESPACE)

    assert _ended(build).status == BuildStatus.RUNNING  # just claimed: its Job may still be on its way
    EnvironmentBuild.objects.unscoped().filter(pk=build.pk).update(started_at=build.started_at - timedelta(seconds=pod_builds.CREATE_GRACE_S + 1))
    build = _ended(build)
    assert build.status == BuildStatus.FAILED
    assert build.error.startswith("the build's Kubernetes Job was deleted before it finished")


def test_a_completed_pod_that_stored_no_result_or_not_its_locks_wheels_fails_the_build(owner, cluster):
    build = _started(owner, lab_wheel())
    cluster.end_build(NAMESPACE, build_job_name(build.pk), {"fetch": 0, "build": 0, "report": 0})
    build = _ended(build)
    assert (build.status, build.error) == (BuildStatus.FAILED, "the build's pod ended without storing its result: see the build log")

    second = _started(owner, lab_wheel("lying-env"))
    result = b'{"status": "ready", "lock": [{"name": "idna", "version": "3.21", "filename": "idna-3.21-py3-none-any.whl", "sha256": "' + b"a" * 64 + b'"}]}'
    assert _callback(second, "result", token=pod_builds.build_token(second), method="put", data=result).status_code == 204
    cluster.end_build(NAMESPACE, build_job_name(second.pk), {"fetch": 0, "build": 0, "report": 0})
    second = _ended(second)
    assert (second.status, second.error) == (BuildStatus.FAILED, "the build's pod did not store idna-3.21-py3-none-any.whl of its lock")


def test_a_job_the_cluster_refuses_fails_the_build_naming_the_error(owner, cluster):
    build = _queued(owner, lab_wheel())
    cluster.fail("apply", 403)
    build_environment(build.pk)

    build.refresh_from_db()
    assert build.status == BuildStatus.FAILED
    assert build.error.startswith("the build's Kubernetes Job could not be created (403: injected)")


def test_a_build_on_the_pool_with_lab_on_an_object_store_stores_the_wheels_it_fetched_in_the_bucket(
    owner, cluster, bucket, s3_server, live_server, settings, tmp_path,
):
    settings.LAB_PUBLIC_URL = live_server.url
    build = _started(owner, lab_wheel("idna-s3-env", extra_requires=("idna",)))
    exit_codes, outputs = run_build_pod(cluster, NAMESPACE, build_job_name(build.pk), tmp_path / "pod")
    assert exit_codes == {"fetch": 0, "build": 0, "report": 0}, outputs
    sweep_environment_builds()

    build.refresh_from_db()
    assert build.status == BuildStatus.READY, (build.error, build_log(build))
    [idna] = build.lock
    keys = s3_server.keys(bucket)
    assert f"lab/checkpoints/environments/wheelhouse/{idna['sha256']}/{idna['filename']}" in keys
    assert f"lab/checkpoints/{build.log_key}" in keys and "smoke rollout of 2 examples" in build_log(build)


def test_the_hub_datasets_a_pod_build_fetched_are_stored_only_as_their_digest_names_and_a_ready_result_needs_them(owner, cluster):
    build = _started(owner, lab_wheel("hub-env"))
    token = pod_builds.build_token(build)
    tar = b"a tar of datasets"
    digest = hashlib.sha256(tar).hexdigest()
    result = b'{"status": "ready", "lock": [], "summary": {"api": "lab", "hub_datasets": {"sha256": "' + digest.encode() + b'"}}}'
    assert _callback(build, "result", token=token, method="put", data=result).status_code == 204

    assert _callback(build, f"hub-datasets/{'0' * 64}", token=token, method="put", data=tar).status_code == 400
    assert _callback(build, f"hub-datasets/{digest}", token=token, method="head").status_code == 404
    cluster.end_build(NAMESPACE, build_job_name(build.pk), {"fetch": 0, "build": 0, "report": 0})
    build = _ended(build)
    assert (build.status, build.error) == (BuildStatus.FAILED, "the build's pod did not store the Hugging Face datasets its loading fetched")

    second = _started(owner, lab_wheel("hub-env-2"))
    token = pod_builds.build_token(second)
    assert _callback(second, "result", token=token, method="put", data=result).status_code == 204
    assert _callback(second, f"hub-datasets/{digest}", token=token, method="put", data=tar).status_code == 201
    cluster.end_build(NAMESPACE, build_job_name(second.pk), {"fetch": 0, "build": 0, "report": 0})
    second = _ended(second)
    assert second.status == BuildStatus.READY and second.summary["hub_datasets"] == {"sha256": digest}


def test_a_pod_build_cannot_name_or_probe_another_organizations_hub_datasets_by_their_digest(owner, outsider, cluster):
    theirs = _started(owner, lab_wheel("private-data-env"))
    tar = b"another organization's datasets"
    digest = hashlib.sha256(tar).hexdigest()
    result = b'{"status": "ready", "lock": [], "summary": {"api": "lab", "hub_datasets": {"sha256": "' + digest.encode() + b'"}}}'
    token = pod_builds.build_token(theirs)
    assert _callback(theirs, "result", token=token, method="put", data=result).status_code == 204
    assert _callback(theirs, f"hub-datasets/{digest}", token=token, method="put", data=tar).status_code == 201
    cluster.end_build(NAMESPACE, build_job_name(theirs.pk), DONE)
    assert _ended(theirs).status == BuildStatus.READY

    hostile = _started(outsider, lab_wheel("digest-thief-env"))
    token = pod_builds.build_token(hostile)
    assert _callback(hostile, f"hub-datasets/{digest}", token=token, method="head").status_code == 404
    assert _callback(hostile, "result", token=token, method="put", data=result).status_code == 204
    cluster.end_build(NAMESPACE, build_job_name(hostile.pk), DONE)
    hostile = _ended(hostile)
    assert (hostile.status, hostile.error) == (BuildStatus.FAILED, "the build's pod did not store the Hugging Face datasets its loading fetched")


# What a hostile package's build pod can send through its callback, and what the sweep does with it.
DONE = {"fetch": 0, "build": 0, "report": 0}


@pytest.mark.parametrize("result", [
    b'{"status": "failed", "error": "nul \\u0000 byte", "lock": []}',
    b'{"status": "failed", "error": "x", "lock": [], "summary": {"loss": NaN}}',
    b'{"status": "failed", "error": "x", "lock": [], "summary": {"api": "lab\\u0000"}}',
    b'{"status": "failed", "python": "3.11\\ud800", "lock": []}',
])
def test_a_result_postgres_cannot_store_fails_that_build_and_the_sweep_still_ends_the_others(owner, cluster, result):
    hostile = _started(owner, lab_wheel("hostile-env"))
    assert _callback(hostile, "result", token=pod_builds.build_token(hostile), method="put", data=result).status_code in (204, 400)
    cluster.end_build(NAMESPACE, build_job_name(hostile.pk), DONE)
    victim = _started(owner, lab_wheel("victim-env"))
    cluster.end_build(NAMESPACE, build_job_name(victim.pk), DONE)

    hostile, victim = _ended(hostile), _ended(victim)
    assert hostile.status == BuildStatus.FAILED and "\x00" not in hostile.error
    assert victim.status == BuildStatus.FAILED and victim.error.startswith("the build's pod ended without storing its result")


@pytest.mark.parametrize("body", [b"[" * 200_000, b'{"a":' * 100_000])
def test_a_deeply_nested_result_is_refused_not_a_server_error(owner, cluster, body):
    build = _started(owner, lab_wheel("nested-env"))
    response = _callback(build, "result", token=pod_builds.build_token(build), method="put", data=body)
    assert response.status_code == 400, response.content


@pytest.mark.parametrize("path", [
    "wheelhouse/" + "a" * 64 + "/x%00-1.0-py3-none-any.whl", "wheelhouse/" + "A" * 64 + "/x-1.0-py3-none-any.whl",
    "wheelhouse/" + "a" * 64 + "/..whl", "wheelhouse/" + "a" * 64 + "/%2e%2e%2fx.whl", "hub-datasets/" + "a" * 65,
    "hub-datasets/..%2f" + "a" * 60, "wheelhouse/" + "a" * 64 + "/" + "x" * 5000 + ".whl",
])
def test_junk_wheelhouse_and_dataset_names_are_refused(owner, cluster, path):
    build = _started(owner, lab_wheel("junk-env"))
    for method in ("head", "put"):
        response = _callback(build, path, token=pod_builds.build_token(build), method=method, data=b"x")
        assert response.status_code in (400, 404), (method, response.status_code)


def test_a_builds_pod_stores_at_most_its_upload_limit_in_the_wheelhouse_and_hub_datasets(owner, cluster, settings):
    settings.LAB_ENVIRONMENT_BUILD_UPLOAD_MAX_BYTES = 100
    build, other = _started(owner, lab_wheel("greedy-env")), _started(owner, lab_wheel("modest-env"))
    for each in (build, other):
        cache.delete(f"environments:build-uploads:{each.pk}:{each.number}")
    token = pod_builds.build_token(build)

    def put(path_of, body: bytes, as_build=build, as_token=token):
        digest = hashlib.sha256(body).hexdigest()
        return _callback(as_build, path_of(digest), token=as_token, method="put", data=body).status_code

    wheel = lambda digest: f"wheelhouse/{digest}/x-1.0-py3-none-any.whl"  # noqa: E731
    assert put(wheel, b"a" * 60) == 201
    assert put(wheel, b"a" * 60) == 200  # stored already: nothing more counted
    assert put(wheel, b"b" * 60) == 413
    assert put(lambda digest: f"hub-datasets/{digest}", b"c" * 41) == 413
    assert put(lambda digest: f"hub-datasets/{digest}", b"c" * 40) == 201
    assert put(wheel, b"b" * 60, as_build=other, as_token=pod_builds.build_token(other)) == 201  # each build its own


@pytest.mark.parametrize("authorization", ["Bearer lbt_", "Bearer lbt_\u00e9\u00e9", "Bearer " + "lbt_" + "x" * 100_000, "Bearer lbt_a:b:c",
                                           "Basic bGJ0Xw==", "Bearer sbt_x.y", "Bearer"])
def test_junk_tokens_and_methods_are_refused_not_a_server_error(owner, cluster, authorization):
    build = _started(owner, lab_wheel("token-junk-env"))
    client = Client()
    for path in ("wheel", "datasets", "log", "result", "hub-datasets/" + "a" * 64, "wheelhouse/" + "a" * 64 + "/x-1-py3-none-any.whl"):
        url = f"/api/v1/environment-builds/{build.pk}/{path}"
        for method in ("get", "put", "post", "delete", "patch", "head", "options"):
            assert getattr(client, method)(url, HTTP_AUTHORIZATION=authorization).status_code in (401, 403), (path, method)
        token = pod_builds.build_token(build)
        for method in ("post", "delete", "patch"):
            assert getattr(client, method)(url, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405, (path, method)
    huge = f"/api/v1/environment-builds/{10**30}/wheel"
    assert client.get(huge, HTTP_AUTHORIZATION=f"Bearer {pod_builds.build_token(build)}").status_code in (401, 404)
