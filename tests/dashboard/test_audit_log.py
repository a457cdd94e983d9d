"""The audit log page: owners see every action with who, what, target, when and request id."""

from __future__ import annotations

import pytest

from lab.models import AuditLogEntry, Membership, Role

pytestmark = pytest.mark.django_db


def test_it_lists_the_actions_taken_in_the_dashboard(owner, member, owner_client):
    owner_client.post("/o/acme/projects/", {"name": "Reverse Text"}, HTTP_X_REQUEST_ID="req-project-1")
    owner_client.post("/o/acme/p/reverse-text/keys/", {"name": "ci", "access": "read"})
    membership = Membership.objects.get(user=member)
    owner_client.post(f"/o/acme/members/{membership.pk}/role/", {"role": "admin"})

    page = owner_client.get("/o/acme/audit/")
    assert page.status_code == 200
    entries = list(page.context["page"])
    assert [entry.action for entry in entries[:3]] == ["membership.set_role", "api_key.create", "project.create"]
    assert {entry.actor_user for entry in entries[:3]} == {owner.user}
    project_entry = entries[2]
    assert (project_entry.target, project_entry.request_id) == ("reverse-text", "req-project-1")
    content = page.content.decode()
    for text in ["membership.set_role", "member@acme.test", "api_key.create", "project.create", "req-project-1"]:
        assert text in content
    assert AuditLogEntry.objects.filter(organization=owner.organization).count() == len(entries)


def test_it_names_api_keys_and_lab_itself_as_actors(owner, owner_client):
    AuditLogEntry.objects.create(organization=owner.organization, actor_api_key=owner.api_key, action="job.create")
    AuditLogEntry.objects.create(organization=owner.organization, action="job.requeue")
    content = owner_client.get("/o/acme/audit/").content.decode()
    assert f"API key test (<code>{owner.api_key.prefix}…</code>)" in content
    assert "<td>Lab</td>" in content


def test_it_refuses_members_and_admins(owner, member, member_client):
    assert member_client.get("/o/acme/audit/").status_code == 403
    Membership.objects.filter(user=member).update(role=Role.ADMIN)
    assert member_client.get("/o/acme/audit/").status_code == 403
    assert b"/o/acme/audit/" not in member_client.get("/o/acme/").content


def test_it_refuses_outsiders_with_404(owner, outsider_client):
    assert outsider_client.get("/o/acme/audit/").status_code == 404


def test_it_keeps_other_organizations_entries_out(owner, outsider, owner_client):
    entries = list(owner_client.get("/o/acme/audit/").context["page"])
    assert entries
    assert {entry.organization_id for entry in entries} == {owner.organization.pk}


def test_it_pages_the_log_newest_first(owner, owner_client):
    AuditLogEntry.objects.bulk_create(
        AuditLogEntry(organization=owner.organization, action="test.action", target=f"t{number}")
        for number in range(60)
    )
    total = AuditLogEntry.objects.filter(organization=owner.organization).count()
    first = owner_client.get("/o/acme/audit/")
    assert len(first.context["page"]) == 50
    assert first.context["page"].paginator.count == total
    assert b'href="?page=2"' in first.content
    second = owner_client.get("/o/acme/audit/?page=2")
    assert len(second.context["page"]) == total - 50
    first_ids = {entry.pk for entry in first.context["page"]}
    assert first_ids.isdisjoint(entry.pk for entry in second.context["page"])
