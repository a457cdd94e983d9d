"""Offboarding: a member who is removed, leaves, or loses the right to create API keys loses the
keys they created in that organization, at once, with an audit row for each key."""

from __future__ import annotations

import pytest

from lab.audit import Actor
from lab.models import ApiKey, AuditLogEntry, Membership, Role
from lab.services import api_key_create, api_key_revoke, membership_remove, membership_set_role, project_create
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(owner: Tenant, member) -> Membership:
    """The member of Acme, made an admin, with two keys of their own in two projects."""
    membership = Membership.objects.get(user=member, organization=owner.organization)
    membership.role = Role.ADMIN
    membership.save(update_fields=["role"])
    return membership


def admin_keys(owner: Tenant, admin: Membership) -> list[tuple[ApiKey, str]]:
    """Create two keys as the admin: one in the default project, one in a second project."""
    actor = Actor(user=admin.user)
    other = project_create(actor=actor, organization=owner.organization, name="Reverse Text")
    return [
        api_key_create(actor=actor, project=owner.project, name="admin ci"),
        api_key_create(actor=actor, project=other, name="admin laptop"),
    ]


def test_it_lets_a_removed_admins_key_no_longer_authenticate(owner, admin):
    (api_key, key), _ = admin_keys(owner, admin)
    assert owner.client(key).get("/api/v1/whoami").status_code == 200

    revoked = membership_remove(actor=Actor(user=owner.user), membership=admin)

    assert revoked == 2
    response = owner.client(key).get("/api/v1/whoami")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    created = owner.client(key).post(
        "/api/v1/webhook-endpoints", {"url": "https://example.com/hook"}, format="json"
    )
    assert created.status_code == 401
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is not None


def test_it_revokes_only_the_removed_members_keys_in_that_organization(owner, admin, outsider):
    admin_keys(owner, admin)
    Membership.objects.create(organization=outsider.organization, user=admin.user, role=Role.ADMIN)
    elsewhere, elsewhere_key = api_key_create(actor=Actor(user=admin.user), project=outsider.project, name="globex")

    membership_remove(actor=Actor(user=owner.user), membership=admin)

    assert owner.client().get("/api/v1/whoami").status_code == 200
    assert outsider.client(elsewhere_key).get("/api/v1/whoami").status_code == 200
    assert sorted(ApiKey.objects.filter(revoked_at__isnull=False).values_list("name", flat=True)) == [
        "admin ci",
        "admin laptop",
    ]
    assert ApiKey.objects.get(pk=elsewhere.pk).revoked_at is None


def test_it_writes_an_audit_row_for_each_revoked_key(owner, admin):
    keys = admin_keys(owner, admin)

    membership_remove(actor=Actor(user=owner.user), membership=admin)

    rows = AuditLogEntry.objects.filter(organization=owner.organization, action="api_key.revoke").order_by("id")
    assert [(row.target, row.actor_user, row.data) for row in rows] == [
        (
            api_key.public_id,
            owner.user,
            {"reason": "membership.remove", "created_by": "member@acme.test"},
        )
        for api_key, _ in keys
    ]
    assert [row.project for row in rows] == [api_key.project for api_key, _ in keys]
    last = AuditLogEntry.objects.filter(organization=owner.organization).order_by("-id").first()
    assert (last.action, last.target, last.data) == ("membership.remove", "member@acme.test", {"revoked_api_keys": 2})


def test_it_revokes_the_keys_of_a_member_who_leaves(owner, admin):
    [(_, key), _] = admin_keys(owner, admin)

    assert membership_remove(actor=Actor(user=admin.user), membership=admin) == 2

    assert owner.client(key).get("/api/v1/whoami").status_code == 401
    rows = AuditLogEntry.objects.filter(action="api_key.revoke", actor_user=admin.user)
    assert rows.count() == 2


def test_it_revokes_the_keys_of_an_admin_demoted_to_member(owner, admin):
    [(_, key), _] = admin_keys(owner, admin)

    membership, revoked = membership_set_role(actor=Actor(user=owner.user), membership=admin, role=Role.MEMBER)

    assert (membership.role, revoked) == (Role.MEMBER, 2)
    assert owner.client(key).get("/api/v1/whoami").status_code == 401
    reasons = AuditLogEntry.objects.filter(action="api_key.revoke").values_list("data", flat=True)
    assert list(reasons) == [{"reason": "membership.set_role", "created_by": "member@acme.test"}] * 2
    role_change = AuditLogEntry.objects.get(action="membership.set_role")
    assert role_change.data == {"from": "admin", "to": "member", "revoked_api_keys": 2}


def test_it_keeps_the_keys_of_a_member_who_may_still_create_keys(owner, admin):
    [(_, key), _] = admin_keys(owner, admin)

    _, revoked = membership_set_role(actor=Actor(user=owner.user), membership=admin, role=Role.OWNER)
    assert revoked == 0
    _, revoked = membership_set_role(actor=Actor(user=owner.user), membership=admin, role=Role.ADMIN)
    assert revoked == 0

    assert owner.client(key).get("/api/v1/whoami").status_code == 200
    assert not AuditLogEntry.objects.filter(action="api_key.revoke").exists()


def test_it_leaves_keys_revoked_before_untouched(owner, admin):
    [(api_key, _), _] = admin_keys(owner, admin)
    api_key_revoke(actor=Actor(user=owner.user), api_key=api_key)
    revoked_at = ApiKey.objects.get(pk=api_key.pk).revoked_at

    assert membership_remove(actor=Actor(user=owner.user), membership=admin) == 1

    assert ApiKey.objects.get(pk=api_key.pk).revoked_at == revoked_at
    assert AuditLogEntry.objects.filter(action="api_key.revoke", target=api_key.public_id).count() == 1
