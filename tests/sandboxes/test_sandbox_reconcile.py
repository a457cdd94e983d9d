"""An agent that restarts loses its sandboxes: the reaper's reconcile pass ends the rows of those
it no longer holds (``failed``, out of the cap, audited), and ends nothing while the agent cannot
be reached. Each test runs its own agent process, killed with SIGKILL and started again."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from lab.models import AuditLogEntry
from sandboxes import services
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.tasks import reap_sandboxes
from tests.support.sandbox_agent import RunningAgent, start_agent

pytestmark = [pytest.mark.django_db]

BASE = "/api/v1/sandboxes"


class Agents:
    """The test's one agent, as started last."""

    def __init__(self) -> None:
        self.current: RunningAgent = start_agent(warm=0)

    def kill(self) -> None:
        self.current.process.kill()
        self.current.process.wait(timeout=20)

    def restart(self) -> None:
        self.current = start_agent(warm=0, like=self.current)


@pytest.fixture
def agents() -> Agents:
    running = Agents()
    yield running
    running.current.stop()


@pytest.fixture(autouse=True)
def runtime(agents, settings):
    """Point Lab at this test's agent instead of the session's."""
    settings.LAB_SANDBOX_AGENT_URL = agents.current.url
    settings.LAB_SANDBOX_DATA_PLANE_URL = agents.current.url
    settings.LAB_SANDBOX_AGENT_SECRET = agents.current.secret
    return services.runtime()


def create(tenant, **body) -> httpx.Response:
    return tenant.client().post(BASE, body, format="json")


def command(created: dict, line: str) -> dict:
    access = created["data_plane"]
    with httpx.Client(base_url=access["url"], headers={"Authorization": f"Bearer {access['token']}"}, timeout=60) as client:
        response = client.post(f"/v1/sandboxes/{created['id']}/commands", json={"command": line})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_restarted_agent_s_lost_sandboxes_end_and_leave_the_cap(owner, agents, settings):
    settings.LAB_SANDBOX_MAX_PER_ORG = 1
    first = create(owner).json()
    assert command(first, "echo before")["stdout"] == "before\n"
    assert create(owner).status_code == 429
    assert reap_sandboxes() == 0  # the agent holds it: nothing ends

    agents.kill()
    agents.restart()
    assert reap_sandboxes() == 1

    lost = Sandbox.objects.unscoped().get(public_id=first["id"])
    assert (lost.status, lost.error) == (SandboxStatus.FAILED, services.LOST_ERROR)
    assert lost.stopped_at is not None
    shown = owner.client().get(f"{BASE}/{first['id']}").json()
    assert (shown["status"], shown["error"]) == ("failed", services.LOST_ERROR)
    entry = AuditLogEntry.objects.get(action="sandbox.lost", target=first["id"])
    assert entry.organization_id == owner.organization.pk and entry.actor_user is None
    assert entry.data["agent_instance"]

    second = create(owner)  # the cap is free again, and the new agent runs the new sandbox
    assert second.status_code == 201, second.content
    assert second.json()["status"] == "running"
    assert command(second.json(), "echo after")["stdout"] == "after\n"
    assert reap_sandboxes() == 0
    assert Sandbox.objects.unscoped().get(public_id=second.json()["id"]).status == SandboxStatus.RUNNING


def test_an_unreachable_agent_ends_nothing(owner, agents):
    sandbox_id = create(owner).json()["id"]
    agents.kill()
    assert services.sandbox_reconcile() == 0
    assert Sandbox.objects.unscoped().get(public_id=sandbox_id).status == SandboxStatus.RUNNING
    assert not AuditLogEntry.objects.filter(action="sandbox.lost").exists()

    agents.restart()  # back, without it: now the pass knows
    assert services.sandbox_reconcile() == 1
    assert Sandbox.objects.unscoped().get(public_id=sandbox_id).status == SandboxStatus.FAILED


def test_only_a_control_token_lists_what_the_agent_holds_and_a_restart_changes_its_instance(owner, agents, runtime):
    sandbox_id = create(owner).json()["id"]
    instance, held = runtime.held()
    assert held == {sandbox_id}
    url = f"{agents.current.url}/v1/sandboxes"
    assert httpx.get(url).status_code == 401
    sandbox_token = runtime.token(sandbox_id, expires_at=time.time() + 60)
    assert httpx.get(url, headers={"Authorization": f"Bearer {sandbox_token}"}).status_code == 404

    agents.kill()
    agents.restart()
    restarted, held = runtime.held()
    assert restarted != instance and held == frozenset()


def test_a_sandbox_started_after_the_agent_was_asked_is_not_taken_for_lost(owner):
    fields = {"organization": owner.organization, "project": owner.project, "image": "python:3.11", "cpu_cores": 1.0,
              "memory_gb": 1.0, "disk_gb": 1.0, "timeout_s": 3600, "status": SandboxStatus.RUNNING}
    earlier = Sandbox.objects.create(started_at=timezone.now() - timedelta(seconds=5), **fields)
    meanwhile = Sandbox.objects.create(started_at=timezone.now() + timedelta(seconds=30), **fields)
    assert services.sandbox_reconcile() == 1
    assert Sandbox.objects.unscoped().get(pk=earlier.pk).status == SandboxStatus.FAILED
    assert Sandbox.objects.unscoped().get(pk=meanwhile.pk).status == SandboxStatus.RUNNING
