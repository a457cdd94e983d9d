"""Sandboxes of two organizations on the Kubernetes warm pool, whose pods' agents share Lab's
agent secret (tests/sandboxes/test_sandbox_pool.py's cluster and real agents): a data-plane token
of one sandbox opens nothing on another organization's pod, neither its sandbox nor (its own
sandbox named) another pod; the other organization's sandbox stays running and its pod claimed."""

from __future__ import annotations

import httpx
import pytest

from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime.pool import SANDBOX_LABEL
from tests.sandboxes import test_sandbox_pool
from tests.sandboxes.test_sandbox_pool import create
from tests.support.sandbox_pool import NAMESPACE

pytestmark = [pytest.mark.django_db]
agents, cluster = test_sandbox_pool.agents, test_sandbox_pool.cluster  # the pool's real agents, the fake cluster


def test_a_sandbox_token_opens_nothing_on_another_organizations_pod(owner, outsider, cluster):
    mine, theirs = create(owner).json(), create(outsider).json()
    assert mine["data_plane"]["url"] != theirs["data_plane"]["url"]  # two pods, two agents
    token = {"Authorization": f"Bearer {mine['data_plane']['token']}"}
    for sandbox_id in (theirs["id"], mine["id"]):
        for method, path, body in (("post", "/commands", {"command": "id"}), ("get", "", None), ("delete", "", None),
                                   ("get", "/logs", None), ("post", "/files/read", {"path": "/etc/hostname"})):
            answer = httpx.request(method.upper(), f"{theirs['data_plane']['url']}/v1/sandboxes/{sandbox_id}{path}",
                                   json=body, headers=token, timeout=30)
            assert answer.status_code in (401, 403, 404), (sandbox_id, method, path, answer.status_code, answer.text)
    their_pod = Sandbox.objects.unscoped().get(public_id=theirs["id"])
    assert their_pod.status == SandboxStatus.RUNNING
    assert cluster.gateway.objects[("Pod", NAMESPACE, their_pod.pod_name)]["metadata"]["labels"][SANDBOX_LABEL] == theirs["id"]
    with httpx.Client(base_url=theirs["data_plane"]["url"], headers={"Authorization": f"Bearer {theirs['data_plane']['token']}"}) as own:
        ran = own.post(f"/v1/sandboxes/{theirs['id']}/commands", json={"command": "echo still mine"}, timeout=60)
    assert (ran.status_code, ran.json()["stdout"]) == (200, "still mine\n")
