"""The dashboard's sandboxes: the project's list (status, image, CPU and memory, created, lifetime
left, labels, why one failed), the status filter, delete, the project page's link, and another
organization's sandbox a 404."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from lab.models import AuditLogEntry
from sandboxes.models import Sandbox, SandboxStatus

PROJECT = "/o/acme/p/default/"
OUTSIDER_PROJECT = "/o/globex/p/default/"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_agent(settings):
    """An agent nobody listens for: a delete still ends the row (the agent stops it at its lifetime)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        settings.LAB_SANDBOX_AGENT_URL = f"http://127.0.0.1:{probe.getsockname()[1]}"


def sandbox(tenant, **fields) -> Sandbox:
    values = {"image": "python:3.11", "cpu_cores": 0.5, "memory_gb": 2.0, "disk_gb": 1.0, "timeout_s": 3600,
              "status": SandboxStatus.RUNNING, "started_at": timezone.now(), **fields}
    return Sandbox.objects.create(organization=tenant.organization, project=tenant.project, **values)


def test_the_list_shows_the_projects_sandboxes_with_limits_lifetime_and_labels(owner, owner_client, outsider):
    running = sandbox(owner, labels={"env": "code"}, name="grader")
    failed = sandbox(owner, status=SandboxStatus.FAILED, error="The sandbox agent no longer holds this sandbox.")
    sandbox(outsider, name="theirs")
    html = owner_client.get(f"{PROJECT}sandboxes/").content.decode()
    assert html.index(failed.public_id) < html.index(running.public_id) and "theirs" not in html
    assert "grader" in html and "env=code" in html and "0.5 cores" in html and "2.0 GB" in html
    assert "The sandbox agent no longer holds this sandbox." in html
    failed_row = html[html.index(f'data-sandbox="{failed.public_id}"'):]
    assert 'class="row-form delete-sandbox"' not in failed_row.split("</tr>")[0]
    left = int(html.split('class="lifetime-left">')[1].split(" s<")[0])
    assert 3500 < left <= 3600
    only_failed = owner_client.get(f"{PROJECT}sandboxes/?status=failed").content.decode()
    assert failed.public_id in only_failed and running.public_id not in only_failed
    assert 'id="project-sandboxes"' in owner_client.get(PROJECT).content.decode()


def test_a_sandbox_past_its_lifetime_shows_none_left(owner, owner_client):
    sandbox(owner, created_at=timezone.now() - timedelta(hours=2))
    html = owner_client.get(f"{PROJECT}sandboxes/").content.decode()
    assert 'class="lifetime-left"' not in html


def test_delete_stops_the_sandbox_and_is_audited(owner, owner_client):
    found = sandbox(owner)
    response = owner_client.post(f"{PROJECT}sandboxes/{found.public_id}/delete/")
    assert response.status_code == 302 and response["Location"] == f"{PROJECT}sandboxes/"
    found.refresh_from_db()
    assert found.status == SandboxStatus.STOPPED and found.stopped_at is not None
    assert AuditLogEntry.objects.filter(action="sandbox.delete", target=found.public_id, actor_user=owner.user).exists()


def test_another_organizations_sandbox_is_a_404(owner, outsider, outsider_client):
    theirs = sandbox(owner)
    for prefix in (PROJECT, OUTSIDER_PROJECT):
        assert outsider_client.post(f"{prefix}sandboxes/{theirs.public_id}/delete/").status_code == 404
    assert outsider_client.post(f"{OUTSIDER_PROJECT}sandboxes/sbx_missing/delete/").status_code == 404
    assert outsider_client.get(f"{PROJECT}sandboxes/").status_code == 404
    assert theirs.public_id not in outsider_client.get(f"{OUTSIDER_PROJECT}sandboxes/").content.decode()
    theirs.refresh_from_db()
    assert theirs.status == SandboxStatus.RUNNING
