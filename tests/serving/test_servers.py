"""Inference servers as real engine processes (serving/servers.py, the local runtime): adapters of
one base model share one server, a full checkpoint gets its own, deleting takes a deployment off
and stops an empty server, an idle server scales to zero and starts again, and what fails says why.

Passes run in this process (``reconcile``); the servers are ``python -m engine serve`` processes
on the tiny model (transformers backend), supervised as the local launcher's engines are.
"""

from __future__ import annotations

import time

import httpx
import pytest

from engine.config import vllm_available
from jobs import storage
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT
from jobs.models import Adapter, AdapterStatus
from jobs.registry.services import model_add
from lab.audit import Actor
from serving.models import Deployment, InferenceServer, ServerStatus
from serving.servers import _spec, reconcile, runtime, server_wake, weights_root
from serving.services import deployment_create, deployment_delete
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.model_dirs import tiny_model_directory
from tests.support.serving import TINY, ready_adapter, ready_artifact, ready_full_checkpoint
from tests.support.tars import tar_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_storage", "servers")]

#: An organization's own model ("Acme"'s namespace), stored by `model_add`.
STORED_ID = "acme/my-model"


@pytest.fixture
def servers(settings, tmp_path):
    """Servers and weights under this test's data dir; every server process ended afterwards."""
    settings.LAB_DATA_DIR = tmp_path / "data"
    yield
    for server in InferenceServer.objects.exclude(handle={}):
        runtime().stop(server.handle, force=True)


def deploy(tenant, source_type: str, source_id: str, **body) -> Deployment:
    return deployment_create(project=tenant.project, actor=Actor(user=tenant.user), data={"source": {"type": source_type, "id": source_id}, **body})


def settle(predicate, *, timeout: float = 120.0):
    """Make passes until ``predicate()`` holds; return its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reconcile()
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not settled within {timeout} s: {list(Deployment.objects.unscoped().values('public_id', 'status', 'status_reason'))} "
                         f"{list(InferenceServer.objects.values('key', 'status', 'status_reason'))}")


def statuses(*deployments: Deployment) -> list[str]:
    return [Deployment.objects.unscoped().get(pk=deployment.pk).status for deployment in deployments]


def health(server: InferenceServer) -> dict:
    server.refresh_from_db()
    return httpx.get(f"{server.url}/health", timeout=10).json()


def test_adapters_of_one_base_share_its_server_and_a_full_checkpoint_gets_its_own(owner):
    first, second = ready_adapter(owner, 0.5), ready_adapter(owner, -0.5)
    full = ready_full_checkpoint(owner)
    deployments = [deploy(owner, "adapter", first), deploy(owner, "adapter", second), deploy(owner, "checkpoint", full), deploy(owner, "model", TINY)]
    settle(lambda: statuses(*deployments) == ["ready"] * 4)
    base, dedicated = InferenceServer.objects.get(key=f"base:{TINY}"), InferenceServer.objects.get(key=f"weights:{full}")
    assert InferenceServer.objects.count() == 2
    assert {deployment.server_id for deployment in Deployment.objects.unscoped().filter(source_id__in=(first, second, TINY))} == {base.pk}
    assert (base.status, dedicated.status) == (ServerStatus.RUNNING, ServerStatus.RUNNING)
    assert health(base)["adapters"]["registered"] == sorted([first, second])
    assert health(dedicated)["model"] == full and health(dedicated)["adapters"]["registered"] == []

    deployment_delete(deployment=deployments[0], actor=Actor(user=owner.user))
    settle(lambda: statuses(deployments[0]) == ["stopped"])
    assert health(base)["adapters"]["registered"] == [second]
    assert statuses(*deployments[1:]) == ["ready"] * 3

    for deployment in deployments[1:]:
        deployment_delete(deployment=deployment, actor=Actor(user=owner.user))
    settle(lambda: set(InferenceServer.objects.values_list("status", flat=True)) == {ServerStatus.STOPPED})
    assert statuses(*deployments) == ["stopped"] * 4
    assert [path.name for path in weights_root().iterdir()] == []  # unpacked weights go with their last deployment
    for server in (base, dedicated):
        server.refresh_from_db()
        assert runtime().observe(server.handle).phase == "exited"


def test_an_idle_server_scales_to_zero_and_the_next_start_registers_its_adapters_again(owner, settings):
    adapter = ready_adapter(owner)
    deployment = deploy(owner, "adapter", adapter)
    settle(lambda: statuses(deployment) == ["ready"])
    server = InferenceServer.objects.get()
    first_handle = server.handle
    settings.LAB_SERVING_IDLE_S = 1
    time.sleep(1.2)
    settle(lambda: InferenceServer.objects.get().status == ServerStatus.STOPPED)
    assert statuses(deployment) == ["ready"]
    assert runtime().observe(first_handle).phase == "exited"

    assert server_wake(server.pk) is True
    assert server_wake(server.pk) is False  # claimed once
    settings.LAB_SERVING_IDLE_S = 900
    settle(lambda: InferenceServer.objects.get().status == ServerStatus.RUNNING)
    server.refresh_from_db()
    assert server.generation == 2 and server.handle != first_handle
    assert health(server)["adapters"] == {"registered": [adapter], "resident": [], "max_resident": settings.LAB_SERVING_MAX_ADAPTERS}


def test_an_organizations_own_stored_model_is_served_from_the_model_store(owner, tmp_path):
    """A model Lab's store holds (here the organization's own, added from a directory) reaches
    its server as ``LAB_JOB_MODEL``: the server fetches it into the model cache, then loads it."""
    added = model_add(organization=owner.organization, model_id=STORED_ID, source_dir=tiny_model_directory(tmp_path / "model"))
    deployment = deploy(owner, "model", STORED_ID)
    settle(lambda: statuses(deployment) == ["ready"])
    server = InferenceServer.objects.get()
    assert _spec(server).stored_model["revision"] == added.model.revision
    assert health(server)["model"] == STORED_ID
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60) as client:
        answer = client.post("/v1/chat/completions", json={"model": STORED_ID, "messages": [{"role": "user", "content": "abc"}],
                                                           "max_tokens": 4, "temperature": 0}).json()
    assert answer["usage"]["completion_tokens"] >= 1, answer
    assert _spec(InferenceServer(model=TINY, served_model=TINY)).stored_model is None  # a built-in is the model cache's


def test_what_cannot_be_served_fails_with_the_reason_and_the_rest_is_served(owner):
    garbage = ready_artifact(owner, ADAPTER, tar_of({"adapter_config.json": b'{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}',
                                                       "adapter_model.safetensors": b"not safetensors"}))
    no_weights = ready_artifact(owner, CHECKPOINT, tar_of({"config.json": b"{}"}), format="hf-full")
    broken_full = ready_artifact(owner, CHECKPOINT, tar_of({"config.json": b'{"model_type": "nonsense"}', "model.safetensors": b"x"}), format="hf-full")
    good = ready_adapter(owner)
    refused, missing, crashing, served = (deploy(owner, "adapter", garbage), deploy(owner, "checkpoint", no_weights),
                                          deploy(owner, "checkpoint", broken_full), deploy(owner, "adapter", good))
    settle(lambda: "deploying" not in statuses(refused, missing, crashing, served) and "pending" not in statuses(refused, missing, crashing, served))
    assert statuses(refused, missing, crashing, served) == ["failed", "failed", "failed", "ready"]
    reasons = {deployment.public_id: Deployment.objects.unscoped().get(pk=deployment.pk).status_reason for deployment in (refused, missing, crashing)}
    assert reasons[refused.public_id].startswith("Its server refused it:")
    assert "holds no .safetensors weights" in reasons[missing.public_id]
    assert reasons[crashing.public_id].startswith("The inference server exited while starting:")
    assert InferenceServer.objects.get(key=f"weights:{broken_full}").status == ServerStatus.FAILED


def test_an_archive_changed_in_storage_is_never_served_and_its_adapter_fails(owner):
    adapter = ready_adapter(owner)
    stored = Adapter.objects.unscoped().get(public_id=adapter)
    storage.path_of(stored.storage_key).write_bytes(b"tampered")
    deployment = deploy(owner, "adapter", adapter)
    settle(lambda: statuses(deployment) == ["failed"])
    assert "failed verification" in Deployment.objects.unscoped().get(pk=deployment.pk).status_reason
    assert Adapter.objects.unscoped().get(public_id=adapter).status == AdapterStatus.FAILED
    assert not InferenceServer.objects.exists()


def test_a_deployment_deleted_before_it_reached_a_server_stops_without_one(owner):
    deployment = deploy(owner, "model", TINY)
    deployment_delete(deployment=deployment, actor=Actor(user=owner.user))
    reconcile()
    assert statuses(deployment) == ["stopped"]
    assert not InferenceServer.objects.exists()


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_a_server_on_vllm_serves_the_adapters_deployed_on_it(owner, settings):
    settings.LAB_SERVING_BACKEND, settings.LAB_SERVING_MAX_LORA_RANK = "vllm", 8
    adapter = ready_adapter(owner)
    deployments = [deploy(owner, "adapter", adapter), deploy(owner, "model", TINY)]
    settle(lambda: statuses(*deployments) == ["ready", "ready"], timeout=300)
    server = InferenceServer.objects.get()
    assert health(server)["backend"] == "vllm" and health(server)["adapters"]["registered"] == [adapter]
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60) as client:
        answers = [client.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "abc"}],
                                                             "max_tokens": 6, "temperature": 0}).json() for model in (adapter, TINY)]
    assert all(answer["usage"]["completion_tokens"] >= 1 for answer in answers)
    assert answers[0]["choices"][0]["message"]["content"] != answers[1]["choices"][0]["message"]["content"]
