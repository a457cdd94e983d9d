"""The SDK's ``lab.deployments`` and the CLI's ``lab deploy`` / ``lab deployments`` (run as a
subprocess) against the real API on a live HTTP server. Serving itself is tested in
test_servers.py and test_serving_e2e.py; here nothing reconciles, so deployments stay pending."""

from __future__ import annotations

import json

import pytest
from labsdk import BadRequestError, Lab, NotFoundError
from labsdk._deployments import DeploymentFailedError, DeploymentWaitTimeoutError

from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.cli import lab_cli
from tests.support.serving import TINY, ready_adapter, ready_full_checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("artifact_storage")]


def test_the_sdk_creates_lists_gets_waits_for_and_deletes(live_server, owner, outsider):
    adapter, checkpoint = ready_adapter(owner), ready_full_checkpoint(owner)
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    first = lab.deployments.create(adapter)
    assert (first.status, first.name, first.source.type, first.mode, first.base_model) == ("pending", f"{TINY}:{adapter}", "adapter", "adapter", TINY)
    assert first.openai_base_url.endswith("/api/v1/openai/v1") and first.usage.requests == 0
    second = lab.deployments.create(checkpoint, name="full")
    assert (second.source.type, second.mode, second.name) == ("checkpoint", "dedicated", "full")
    third = lab.deployments.create(TINY)
    assert (third.source.type, third.mode, third.name) == ("model", "base", TINY)
    assert [deployment.id for deployment in lab.deployments.list()] == [third.id, second.id, first.id]
    assert lab.deployments.get(first.id) == first
    with pytest.raises(NotFoundError):
        Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0).deployments.get(first.id)
    with pytest.raises(BadRequestError) as refused:
        lab.deployments.create("adp_00000000000000000000")
    assert refused.value.param == "source.id"
    with pytest.raises(DeploymentWaitTimeoutError) as waited:
        lab.deployments.wait(first.id, timeout=0.3, poll_interval=0.1)
    assert waited.value.deployment.status == "pending"
    assert lab.deployments.delete(first.id).status == "unloading"
    with pytest.raises(DeploymentFailedError):
        lab.deployments.wait(first.id)
    assert [deployment.id for deployment in lab.deployments.list(status="unloading")] == [first.id]


def test_the_cli_deploys_lists_shows_and_deletes(live_server, owner, outsider, settings):
    settings.LAB_PUBLIC_URL = live_server.url  # what the server tells clients to use
    adapter = ready_adapter(owner)
    deployed = lab_cli("deploy", adapter, "--name", "mine", key=owner.key, base_url=live_server.url)
    assert deployed.returncode == 0, deployed.stderr
    deployment_id = deployed.stdout.strip()
    assert deployment_id.startswith("dep_")
    assert f"model=mine status=pending base_url={live_server.url}/api/v1/openai/v1" in deployed.stderr
    listed = lab_cli("deployments", "list", "--json", key=owner.key, base_url=live_server.url)
    assert [item["id"] for item in json.loads(listed.stdout)] == [deployment_id]
    table = lab_cli("deployments", key=owner.key, base_url=live_server.url)
    assert deployment_id in table.stdout and "mine" in table.stdout
    shown = lab_cli("deployments", "get", deployment_id, key=owner.key, base_url=live_server.url)
    assert shown.stdout.startswith(f"{deployment_id} pending model=mine source=adapter:{adapter} mode=adapter")
    foreign = lab_cli("deployments", "get", deployment_id, key=outsider.key, base_url=live_server.url)
    assert foreign.returncode == 1 and "not_found" in foreign.stderr
    refused = lab_cli("deploy", "adp_00000000000000000000", key=owner.key, base_url=live_server.url)
    assert refused.returncode == 1 and "invalid_request" in refused.stderr and refused.stdout == ""
    deleted = lab_cli("deployments", "delete", deployment_id, key=owner.key, base_url=live_server.url)
    assert (deleted.returncode, deleted.stdout) == (0, f"{deployment_id} unloading\n")
