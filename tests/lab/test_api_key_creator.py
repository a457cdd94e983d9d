"""An API key acts for the owner or admin who created it and authenticates only while they still
are one in the key's organization (docs/api.md "API keys"), however their membership changed:
through the services (which also revoke the keys, tests/lab/test_offboarding.py), or directly
(the Django admin, a deleted or deactivated user). Organization-wide billing follows the key's
creator too."""

from __future__ import annotations

import pytest
from django.test import Client

from billing.accounts import account_for
from billing.services import billing_settings_update
from lab.api.errors import http_status
from lab.audit import Actor
from lab.errors import LabError
from lab.models import ApiKey, AuditLogEntry, Membership, Organization, Role, User
from lab.services import api_key_authenticate, api_key_create
from tests.conftest import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(owner: Tenant, member: User) -> Membership:
    """Acme's member, made an admin."""
    membership = Membership.objects.get(user=member, organization=owner.organization)
    Membership.objects.filter(pk=membership.pk).update(role=Role.ADMIN)
    membership.refresh_from_db()
    return membership


@pytest.fixture
def admin_key(owner: Tenant, admin: Membership) -> tuple[ApiKey, str]:
    """A read-write key of Acme's default project, created by the admin."""
    return api_key_create(actor=Actor(user=admin.user), project=owner.project, name="admin ci")


def assert_refused(response) -> None:
    assert response.status_code == 401, response.content
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_it_authenticates_a_key_while_its_creator_is_an_admin(owner, admin_key):
    api_key, key = admin_key
    response = owner.client(key).get("/api/v1/whoami")
    assert response.status_code == 200
    assert response.json()["project"]["slug"] == "default"
    assert api_key.created_by.email == "member@acme.test"


@pytest.mark.parametrize(
    "change",
    ["membership deleted", "lowered to member", "user deleted", "user deactivated"],
)
def test_it_refuses_a_key_whose_creator_may_no_longer_make_keys(owner, admin, admin_key, change):
    api_key, key = admin_key
    # Directly, as the Django admin or a script would: no service revoked the key.
    if change == "membership deleted":
        Membership.objects.filter(pk=admin.pk).delete()
    elif change == "lowered to member":
        Membership.objects.filter(pk=admin.pk).update(role=Role.MEMBER)
    elif change == "user deleted":
        User.objects.filter(pk=admin.user_id).delete()
    else:
        User.objects.filter(pk=admin.user_id).update(is_active=False)

    assert_refused(owner.client(key).get("/api/v1/whoami"))
    assert_refused(owner.client(key).post("/api/v1/webhook-endpoints", {"url": "https://example.com/hook"}, format="json"))
    assert api_key_authenticate(key) is None
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is None  # refused by the rule, not by a revocation
    assert owner.client().get("/api/v1/whoami").status_code == 200  # the owner's own key is untouched


def test_a_membership_in_another_organization_does_not_keep_the_key(owner, outsider, admin, admin_key):
    _, key = admin_key
    Membership.objects.create(organization=outsider.organization, user=admin.user, role=Role.OWNER)

    Membership.objects.filter(pk=admin.pk).delete()

    assert_refused(owner.client(key).get("/api/v1/whoami"))


def test_a_key_works_again_if_its_creator_is_made_an_admin_again_unless_it_was_revoked(owner, admin, admin_key):
    """The rule reads the membership as it is now; a revocation (by the services) is for good."""
    api_key, key = admin_key
    Membership.objects.filter(pk=admin.pk).update(role=Role.MEMBER)
    assert_refused(owner.client(key).get("/api/v1/whoami"))

    Membership.objects.filter(pk=admin.pk).update(role=Role.OWNER)
    assert owner.client(key).get("/api/v1/whoami").status_code == 200

    ApiKey.objects.filter(pk=api_key.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert_refused(owner.client(key).get("/api/v1/whoami"))


def test_an_open_stream_counts_a_key_whose_creator_left_as_gone(owner, admin, admin_key):
    from jobs.stream.views import _allowed

    api_key, _ = admin_key
    assert _allowed(("key", api_key.pk), job_pk=0)

    Membership.objects.filter(pk=admin.pk).delete()

    assert not _allowed(("key", api_key.pk), job_pk=0)


def test_the_keys_page_shows_a_key_whose_creator_left_as_inactive(owner, admin, admin_key):
    Membership.objects.filter(pk=admin.pk).update(role=Role.MEMBER)
    client = Client()
    client.force_login(owner.user)

    page = client.get("/o/acme/p/default/keys/").content.decode()

    assert page.count("inactive: its creator is no longer an owner or admin") == 1
    assert page.count("<td>active</td>") == 1  # the owner's own key


def test_the_system_names_an_owner_or_admin_as_the_creator_of_a_key(owner, member):
    actor = Actor.system()
    with pytest.raises(LabError) as missing:
        api_key_create(actor=actor, project=owner.project, name="nobody's")
    assert (missing.value.code, missing.value.param) == ("invalid_request", "created_by")
    with pytest.raises(LabError) as plain_member:
        api_key_create(actor=actor, project=owner.project, name="member's", created_by=member)
    assert (plain_member.value.param, plain_member.value.message) == (
        "created_by",
        "member@acme.test is not an owner or admin of acme; only they create API keys.",
    )
    with pytest.raises(LabError):
        api_key_create(actor=Actor(user=owner.user), project=owner.project, name="for another", created_by=member)
    assert list(ApiKey.objects.values_list("name", flat=True)) == ["test"]
    assert AuditLogEntry.objects.filter(action="api_key.create").count() == 1

    api_key, key = api_key_create(actor=actor, project=owner.project, name="system", created_by=owner.user)
    assert api_key.created_by == owner.user
    assert api_key_authenticate(key) == api_key


# --- billing: the organization's, for owners and admins only ---------------------------------------

SETTINGS = {"monthly_spend_limit_usd": "1.00", "max_running_jobs": 1, "plan": "prepaid"}


def assert_billing_unchanged(owner: Tenant) -> None:
    account = account_for(owner.organization.pk)
    assert (account.monthly_spend_limit_micro_usd, account.plan) == (None, "prepaid")
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs is None
    assert not AuditLogEntry.objects.filter(action="billing.settings_update").exists()


def test_a_write_key_of_an_admin_changes_the_billing_settings(owner, admin_key):
    _, key = admin_key
    response = owner.client(key).patch("/api/v1/billing/settings", {"max_running_jobs": 1}, format="json")
    assert response.status_code == 200, response.content
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs == 1


@pytest.mark.parametrize("change", ["lowered to member", "membership deleted", "user deleted"])
def test_a_write_key_whose_creator_is_not_an_owner_or_admin_changes_no_billing_setting(owner, admin, admin_key, change):
    api_key, key = admin_key
    if change == "lowered to member":
        Membership.objects.filter(pk=admin.pk).update(role=Role.MEMBER)
    elif change == "membership deleted":
        Membership.objects.filter(pk=admin.pk).delete()
    else:
        User.objects.filter(pk=admin.user_id).delete()
    api_key.refresh_from_db()

    # Through the API the key no longer authenticates at all ...
    assert_refused(owner.client(key).patch("/api/v1/billing/settings", SETTINGS, format="json"))
    # ... and the billing service refuses it by itself, whoever calls it.
    with pytest.raises(LabError) as refused:
        billing_settings_update(actor=Actor(api_key=api_key), organization=owner.organization, data=SETTINGS)
    assert (http_status(refused.value), refused.value.code) == (403, "insufficient_scope")
    assert refused.value.message == "Only organization owners and admins change billing; this API key's creator is not one."
    assert_billing_unchanged(owner)
