"""What a hostile package's build pod can send through its build's callback
(environments.build_views) and what Lab's build sweep does with it: nothing it stores may stop
the sweep ending other organizations' builds, and junk is refused, never a 500."""

from __future__ import annotations

import hashlib

import pytest
from django.test import Client

from environments import pod_builds
from environments.models import BuildStatus
from jobs.launchers.kubernetes.builds import build_job_name
from tests.environments import test_pod_builds
from tests.environments.test_pod_builds import NAMESPACE, _callback, _ended, _started
from tests.support.wheelbuilder import lab_wheel

pytestmark = [pytest.mark.django_db]
cluster, index = test_pod_builds.cluster, test_pod_builds.index  # the in-memory cluster and package index
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
    from django.core.cache import cache

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
