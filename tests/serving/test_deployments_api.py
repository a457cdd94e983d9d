"""The deployment REST API (docs/serving.md): create from an adapter, a checkpoint or a model,
list, get, delete, events and webhooks; bad input, scopes, the organization's cap, billing and
another organization's deployments."""

from __future__ import annotations

import json

import pytest

from billing.accounts import account_for
from billing.models import BillingAccount
from jobs.models import Adapter, AdapterStatus
from jobs.webhooks.models import WebhookMessage
from lab.audit import Actor
from lab.models import AuditLogEntry
from lab.services import api_key_create
from serving.models import Deployment, DeploymentEvent, DeploymentStatus
from serving.services import deployment_transition
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.schema_check import assert_matches, served_document
from tests.support.serving import TINY, ready_adapter, ready_full_checkpoint, ready_lora_checkpoint

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("artifact_storage")]


BASE = "/api/v1/deployments"


def create(tenant, source: dict, **body):
    response = tenant.client().post(BASE, {"source": source, **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_it_deploys_an_adapter_under_its_base_model_and_id(owner):
    adapter = ready_adapter(owner)
    body = create(owner, {"type": "adapter", "id": adapter})
    deployment = Deployment.objects.unscoped().get()
    assert body == {
        "id": deployment.public_id,
        "object": "deployment",
        "name": f"{TINY}:{adapter}",
        "status": "pending",
        "status_reason": None,
        "source": {"type": "adapter", "id": adapter},
        "base_model": TINY,
        "mode": "adapter",
        "server_status": None,
        "openai_base_url": "http://127.0.0.1:8000/api/v1/openai/v1",
        "usage": {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "gpu_seconds": 0.0, "cpu_seconds": 0.0, "cost_usd": "0.00"},
        "created_at": body["created_at"],
        "ready_at": None,
        "stopped_at": None,
    }
    assert body["id"].startswith("dep_")
    assert (deployment.project, deployment.organization) == (owner.project, owner.organization)
    assert list(DeploymentEvent.objects.filter(deployment=deployment).values_list("type", flat=True)) == ["deployment.pending"]
    assert AuditLogEntry.objects.filter(action="deployment.create", target=deployment.public_id).count() == 1
    assert owner.client().get(f"{BASE}/{deployment.public_id}").json() == body
    assert_matches(served_document(), "Deployment", body)


def test_a_full_checkpoint_gets_a_server_of_its_own_and_a_model_is_served_as_the_base(owner):
    full, lora = ready_full_checkpoint(owner), ready_lora_checkpoint(owner)
    assert create(owner, {"type": "checkpoint", "id": full}, name="my-full")["mode"] == "dedicated"
    assert create(owner, {"type": "checkpoint", "id": lora})["mode"] == "adapter"
    model = create(owner, {"type": "model", "id": TINY})
    assert (model["name"], model["mode"], model["base_model"]) == (TINY, "base", TINY)


@pytest.mark.parametrize("body, param", [
    ({}, "source"),
    ({"source": "adp_x"}, "source"),
    ({"source": {"type": "adapter"}}, "source"),
    ({"source": {"type": "weights", "id": "x"}}, "source.type"),
    ({"source": {"type": "model", "id": "primeintellect/nope"}}, "source.id"),
    ({"source": {"type": "adapter", "id": "adp_missing"}}, "source.id"),
    ({"source": {"type": "checkpoint", "id": "x" * 500}}, "source.id"),
    ({"source": {"type": "model", "id": TINY}, "name": " bad name"}, "name"),
    ({"source": {"type": "model", "id": TINY}, "name": "x" * 201}, "name"),
    ({"source": {"type": "model", "id": TINY}, "replicas": 2}, "replicas"),
])
def test_it_refuses_a_bad_body_with_400_and_creates_nothing(owner, body, param):
    response = owner.client().post(BASE, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["param"] == param
    assert not Deployment.objects.unscoped().exists()


def test_another_projects_adapter_is_as_unknown_as_a_missing_one(owner, outsider):
    theirs = ready_adapter(outsider)
    response = owner.client().post(BASE, {"source": {"type": "adapter", "id": theirs}}, format="json")
    missing = owner.client().post(BASE, {"source": {"type": "adapter", "id": "adp_00000000000000000000"}}, format="json")
    assert response.status_code == missing.status_code == 400
    assert response.json()["error"]["message"].replace(theirs, "ID") == missing.json()["error"]["message"].replace("adp_00000000000000000000", "ID")
    assert not Deployment.objects.unscoped().exists()


def test_an_adapter_that_is_not_ready_is_a_conflict(owner):
    adapter = ready_adapter(owner)
    Adapter.objects.unscoped().filter(public_id=adapter).update(status=AdapterStatus.DELETED)
    response = owner.client().post(BASE, {"source": {"type": "adapter", "id": adapter}}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "adapter_not_ready"


def test_a_name_is_held_while_its_deployment_is_active(owner):
    first = create(owner, {"type": "model", "id": TINY}, name="chat")
    response = owner.client().post(BASE, {"source": {"type": "model", "id": TINY}, "name": "chat"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "name"
    deployment = Deployment.objects.unscoped().get(public_id=first["id"])
    deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason="test")
    assert create(owner, {"type": "model", "id": TINY}, name="chat")["name"] == "chat"


def test_it_lists_newest_first_and_filters_by_status(owner):
    first = create(owner, {"type": "model", "id": TINY}, name="one")
    second = create(owner, {"type": "model", "id": TINY}, name="two")
    deployment_transition(deployment=Deployment.objects.unscoped().get(public_id=first["id"]), to=DeploymentStatus.FAILED, reason="x")
    listing = owner.client().get(BASE).json()
    assert [item["id"] for item in listing["data"]] == [second["id"], first["id"]] and listing["has_more"] is False
    assert [item["id"] for item in owner.client().get(BASE, {"status": "failed"}).json()["data"]] == [first["id"]]
    assert owner.client().get(BASE, {"status": "sleeping"}).status_code == 400
    assert_matches(served_document(), "DeploymentList", listing)


def test_delete_unloads_once_and_leaves_the_row_listed(owner):
    body = create(owner, {"type": "model", "id": TINY})
    response = owner.client().delete(f"{BASE}/{body['id']}")
    assert response.status_code == 200 and response.json()["status"] == "unloading"
    assert owner.client().delete(f"{BASE}/{body['id']}").json()["status"] == "unloading"
    events = owner.client().get(f"{BASE}/{body['id']}/events").json()["data"]
    assert [event["type"] for event in events] == ["deployment.pending", "deployment.unloading"]
    assert AuditLogEntry.objects.filter(action="deployment.delete", target=body["id"]).count() == 1
    assert_matches(served_document(), "DeploymentEventList", owner.client().get(f"{BASE}/{body['id']}/events").json())


def test_an_outsider_gets_404_on_every_route_and_changes_nothing(owner, outsider):
    body = create(owner, {"type": "model", "id": TINY})
    for method, path in (("get", body["id"]), ("delete", body["id"]), ("get", f"{body['id']}/events")):
        theirs = getattr(outsider.client(), method)(f"{BASE}/{path}")
        missing = getattr(outsider.client(), method)(f"{BASE}/{path.replace(body['id'], 'dep_00000000000000000000')}")
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json() == missing.json()
    assert outsider.client().get(BASE).json()["data"] == []
    assert Deployment.objects.unscoped().get().status == "pending"


def test_a_read_key_reads_but_neither_creates_nor_deletes(owner):
    body = create(owner, {"type": "model", "id": TINY})
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    client = owner.client(read_key)
    assert client.get(f"{BASE}/{body['id']}").status_code == 200
    assert client.post(BASE, {"source": {"type": "model", "id": TINY}, "name": "x"}, format="json").status_code == 403
    assert client.delete(f"{BASE}/{body['id']}").status_code == 403
    assert Deployment.objects.unscoped().count() == 1 and Deployment.objects.unscoped().get().status == "pending"


def test_the_organizations_cap_holds(owner, settings):
    settings.LAB_SERVING_MAX_DEPLOYMENTS_PER_ORG = 1
    create(owner, {"type": "model", "id": TINY})
    response = owner.client().post(BASE, {"source": {"type": "model", "id": TINY}, "name": "two"}, format="json")
    assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limited"
    assert Deployment.objects.unscoped().count() == 1


def test_nothing_is_deployed_when_billing_allows_nothing_to_run(owner, settings):
    settings.STRIPE_API_KEY = "sk_test_lab"
    BillingAccount.objects.filter(pk=account_for(owner.organization.pk).pk).update(balance_micro_usd=0)
    response = owner.client().post(BASE, {"source": {"type": "model", "id": TINY}}, format="json")
    assert response.status_code == 402 and response.json()["error"]["code"] == "insufficient_credit"
    assert not Deployment.objects.unscoped().exists()


def test_ready_and_failed_are_sent_to_subscribed_webhook_endpoints(owner):
    response = owner.client().post("/api/v1/webhook-endpoints", {"url": "https://hooks.example.com/lab", "events": ["deployment.ready", "deployment.failed"]}, format="json")
    assert response.status_code == 201, response.content
    adapter = ready_adapter(owner)
    ready = Deployment.objects.unscoped().get(public_id=create(owner, {"type": "adapter", "id": adapter})["id"])
    failed = Deployment.objects.unscoped().get(public_id=create(owner, {"type": "model", "id": TINY})["id"])
    for deployment, to in ((ready, DeploymentStatus.DEPLOYING), (ready, DeploymentStatus.READY), (failed, DeploymentStatus.FAILED)):
        assert deployment_transition(deployment=deployment, to=to, reason="its server refused it" if to == "failed" else "")
    messages = {message.type: json.loads(message.body) for message in WebhookMessage.objects.filter(project=owner.project)}
    assert set(messages) == {"deployment.ready", "deployment.failed"}
    assert messages["deployment.ready"]["data"]["id"] == ready.public_id and messages["deployment.ready"]["data"]["status"] == "ready"
    assert messages["deployment.failed"]["data"]["status_reason"] == "its server refused it"
    assert messages["deployment.ready"]["id"] == DeploymentEvent.objects.get(deployment=ready, type="deployment.ready").public_id
