"""The dashboard's deployments: the project's list, a deployment's page (status, reason, events,
requests, tokens, latency percentiles), "Deploy" from a job's adapter and checkpoint rows, delete,
and the playground's relay (session and CSRF; the OpenAI-compatible API's own checks). Another
organization's deployment is a 404 on every page."""

from __future__ import annotations

import pytest
from django.test import Client

from billing.tokens import token_usage_record
from jobs.models import Adapter
from lab.audit import Actor
from serving.models import Deployment, DeploymentStatus
from serving.services import deployment_create, deployment_transition
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.dashboard import signed_in
from tests.support.serving import TINY, ready_adapter

PROJECT = "/o/acme/p/default/"
OUTSIDER_PROJECT = "/o/globex/p/default/"


@pytest.fixture(autouse=True)
def _no_broker(no_broker):
    """Keep the reconcile pass from reaching a broker: these tests look at pages, not at servers."""


def deployed(tenant, name: str | None = None) -> Deployment:
    data = {"source": {"type": "model", "id": TINY}, **({"name": name} if name else {})}
    return deployment_create(project=tenant.project, actor=Actor(user=tenant.user), data=data)


def served(deployment: Deployment, request_id: str, *, duration_ms: int, first_token_ms: int | None = None) -> None:
    token_usage_record(
        organization_id=deployment.organization_id, project_id=deployment.project_id, request_id=request_id,
        deployment_public_id=deployment.public_id, model=deployment.base_model, prompt_tokens=10, completion_tokens=30,
        duration_ms=duration_ms, first_token_ms=first_token_ms,
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("artifact_storage", "default_prices")
def test_deploy_from_an_adapter_row_opens_the_deployment_page(owner, owner_client):
    adapter = ready_adapter(owner)
    job = Adapter.objects.unscoped().get(public_id=adapter).job
    listing = owner_client.get(f"{PROJECT}jobs/{job.public_id}/adapters/").content.decode()
    assert 'class="row-form deploy-adapter"' in listing and f'name="source_id" value="{adapter}"' in listing

    response = owner_client.post(f"{PROJECT}deployments/new/", {"source_type": "adapter", "source_id": adapter})
    deployment = Deployment.objects.unscoped().get()
    assert response.status_code == 302 and response["Location"] == f"{PROJECT}deployments/{deployment.public_id}/"
    assert (deployment.source_type, deployment.source_id, deployment.mode) == ("adapter", adapter, "adapter")
    page = owner_client.get(response["Location"]).content.decode()
    assert f"{TINY}:{adapter}" in page and 'id="deployment-status">pending<' in page
    assert "deployment.pending" in page
    assert 'id="chat-form"' not in page  # not ready: no playground yet


@pytest.mark.django_db
@pytest.mark.usefixtures("default_prices")
def test_the_page_shows_requests_tokens_cost_and_latency_percentiles(owner, owner_client):
    deployment = deployed(owner)
    deployment_transition(deployment=deployment, to=DeploymentStatus.FAILED, reason="weights_invalid", message="Its weights do not load.")
    for number, duration in enumerate([100, 200, 300, 400]):
        served(deployment, f"req_{number}", duration_ms=duration, first_token_ms=duration // 10 if number % 2 else None)
    page = owner_client.get(f"{PROJECT}deployments/{deployment.public_id}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="usage-requests">4<' in html and 'id="usage-prompt-tokens">40<' in html and 'id="usage-completion-tokens">120<' in html
    assert 'id="usage-cost">0.00004<' in html  # 40 × $0.10 + 120 × $0.30 per million
    assert "<tr><th>p50</th><td class=\"num\">200</td><td class=\"num\">20</td></tr>" in html
    assert "<tr><th>p99</th><td class=\"num\">400</td><td class=\"num\">40</td></tr>" in html
    assert 'id="deployment-reason">weights_invalid<' in html and "Its weights do not load." in html
    assert "deployment.failed" in html


@pytest.mark.django_db
def test_the_list_shows_the_projects_deployments_filtered_by_status(owner, owner_client, outsider):
    first, second = deployed(owner, "first"), deployed(owner, "second")
    deployed(outsider, "theirs")
    deployment_transition(deployment=second, to=DeploymentStatus.FAILED, reason="server_failed")
    html = owner_client.get(f"{PROJECT}deployments/").content.decode()
    assert html.index(second.public_id) < html.index(first.public_id) and "theirs" not in html
    failed = owner_client.get(f"{PROJECT}deployments/?status=failed").content.decode()
    assert second.public_id in failed and first.public_id not in failed
    assert 'id="project-deployments"' in owner_client.get(PROJECT).content.decode()


@pytest.mark.django_db
def test_delete_unloads_the_deployment(owner, owner_client):
    deployment = deployed(owner)
    response = owner_client.post(f"{PROJECT}deployments/{deployment.public_id}/delete/")
    assert response.status_code == 302
    assert Deployment.objects.unscoped().get(pk=deployment.pk).status == DeploymentStatus.UNLOADING


@pytest.mark.django_db
@pytest.mark.usefixtures("artifact_storage")
def test_another_organizations_deployment_is_a_404_on_every_page(owner, outsider, outsider_client):
    theirs = deployed(owner)
    adapter = ready_adapter(owner)
    missing = outsider_client.get(f"{OUTSIDER_PROJECT}deployments/dep_missing/")
    assert missing.status_code == 404
    for page in ("", "delete/"):
        for prefix in (PROJECT, OUTSIDER_PROJECT):
            url = f"{prefix}deployments/{theirs.public_id}/{page}"
            response = outsider_client.post(url) if page else outsider_client.get(url)
            assert response.status_code == 404, url
    assert outsider_client.get(f"{PROJECT}deployments/").status_code == 404
    assert theirs.public_id not in outsider_client.get(f"{OUTSIDER_PROJECT}deployments/").content.decode()
    refused = outsider_client.post(f"{OUTSIDER_PROJECT}deployments/new/", {"source_type": "adapter", "source_id": adapter}, follow=True)
    assert refused.status_code == 200 and "source.id" not in refused.content.decode()
    assert Deployment.objects.unscoped().count() == 1 and Deployment.objects.unscoped().get().status == DeploymentStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_the_playground_relays_for_members_only_with_csrf(owner, outsider):
    deployment = deployed(owner)
    chat = f"{PROJECT}deployments/{deployment.public_id}/chat/"
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    member = signed_in(owner.user)
    # the relay's own answers: a deployment still pending is 503 model_not_ready, a bad body its 400
    pending = member.post(chat, body, content_type="application/json")
    assert (pending.status_code, pending.json()["error"]["code"]) == (503, "model_not_ready")
    bad = member.post(chat, {"messages": "hi"}, content_type="application/json")
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "messages")
    csrf_checked = Client(enforce_csrf_checks=True)
    csrf_checked.force_login(owner.user)
    assert csrf_checked.post(chat, body, content_type="application/json").status_code == 403
    anonymous = Client().post(chat, body, content_type="application/json")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    intruder = signed_in(outsider.user)
    for url in (chat, f"{OUTSIDER_PROJECT}deployments/{deployment.public_id}/chat/"):
        assert intruder.post(url, body, content_type="application/json").status_code == 404
