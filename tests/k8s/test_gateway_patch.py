"""The real gateway's merge patch against a fake API HTTP server (pytest-httpserver): the body goes
as ``application/merge-patch+json`` with the ``resourceVersion`` it names, and a 409 Conflict
(the object changed since) is a ClusterError the caller sees, never retried."""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from jobs.launchers.kubernetes.gateway import ClusterError, KubernetesGateway
from jobs.launchers.kubernetes.kinds import POD
from jobs.launchers.kubernetes.sandbox_pods import GatewayPods
from sandboxes.runtime.pool import PodConflict

POD_PATH = "/api/v1/namespaces/lab-sandboxes/pods/lab-sandbox-pool-python-3-11-x"
PATCH = {"metadata": {"resourceVersion": "41", "labels": {"lab.dev/sandbox-state": "claimed"}}}


@pytest.fixture
def gateway(httpserver) -> KubernetesGateway:
    configuration = client.Configuration()
    configuration.host = httpserver.url_for("/").rstrip("/")
    configuration.api_key = {"authorization": "Bearer test-token"}
    return KubernetesGateway(configuration, sleep=lambda seconds: None, max_retries=3)


def test_it_sends_a_merge_patch_with_the_resource_version(httpserver, gateway):
    stored = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "resourceVersion": "42",
                                                             "labels": {"lab.dev/sandbox-state": "claimed"}}}
    httpserver.expect_oneshot_request(POD_PATH, method="PATCH", headers={"Content-Type": "application/merge-patch+json"}).respond_with_json(stored)

    assert gateway.patch(POD, "lab-sandbox-pool-python-3-11-x", "lab-sandboxes", PATCH) == stored
    assert json.loads(httpserver.log[0][0].get_data()) == PATCH


def test_a_conflict_is_raised_once_and_the_pool_takes_it_for_a_lost_race(httpserver, gateway):
    conflict = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict",
                "message": "the object has been modified; please apply your changes to the latest version and try again"}
    httpserver.expect_request(POD_PATH, method="PATCH").respond_with_json(conflict, status=409)

    with pytest.raises(ClusterError) as raised:
        gateway.patch(POD, "lab-sandbox-pool-python-3-11-x", "lab-sandboxes", PATCH)
    assert raised.value.status == 409 and "modified" in raised.value.message
    with pytest.raises(PodConflict):
        GatewayPods(gateway, namespace="lab-sandboxes").relabel(
            "lab-sandbox-pool-python-3-11-x", {"lab.dev/sandbox-state": "claimed"}, {}, resource_version="41")
    assert len(httpserver.log) == 2
