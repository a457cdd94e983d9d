"""``manage.py bootstrap_tenant`` (docs/api.md "Set-up")."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from lab.models import ApiKey, Membership, Organization, Project, Role, User

pytestmark = pytest.mark.django_db


def run(*args: str) -> dict:
    out = io.StringIO()
    call_command("bootstrap_tenant", *args, stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_it_creates_the_tenant_and_prints_a_working_key():
    result = run("--org", "acme", "--project", "rl", "--email", "Ada@Example.com", "--password", "a-long-passphrase-1")
    assert set(result) == {"organization", "project", "api_key", "user"}
    assert result["organization"] == "acme"
    assert result["project"] == "rl"
    assert result["user"] == "ada@example.com"
    assert result["api_key"].startswith("lab_")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {result['api_key']}")
    whoami = client.get("/api/v1/whoami").json()
    assert whoami["organization"]["slug"] == "acme"
    assert whoami["project"]["slug"] == "rl"
    assert whoami["scopes"] == ["read", "write"]
    assert Membership.objects.get(user__email="ada@example.com").role == Role.OWNER
    assert User.objects.get(email="ada@example.com").check_password("a-long-passphrase-1")


def test_it_is_idempotent_but_adds_a_key_each_call():
    first = run("--org", "acme", "--project", "rl", "--email", "ada@example.com")
    second = run("--org", "acme", "--project", "rl", "--email", "ada@example.com")
    assert first["api_key"] != second["api_key"]
    assert User.objects.count() == 1
    assert Organization.objects.count() == 1
    assert Project.objects.count() == 1
    assert ApiKey.objects.count() == 2
    assert Membership.objects.count() == 1


@pytest.mark.parametrize(
    "args",
    [
        ("--org", "acme", "--project", "rl", "--email", "not-an-email"),
        ("--org", "acme", "--project", "rl", "--email", ""),
        ("--org", "Acme Corp", "--project", "rl", "--email", "a@example.com"),
        ("--org", "acme", "--project", "../etc", "--email", "a@example.com"),
        ("--org", "acme", "--project", "rl", "--email", "a@example.com", "--password", "123"),
    ],
)
def test_it_refuses_bad_input_and_creates_nothing(args):
    with pytest.raises(CommandError) as excinfo:
        run(*args)
    assert "\n" not in str(excinfo.value)
    assert User.objects.count() == 0
    assert Organization.objects.count() == 0
    assert ApiKey.objects.count() == 0


def test_its_key_acts_for_the_user_and_goes_when_the_user_leaves():
    """The key has a creator, the bootstrap user, so it follows their membership like any key
    (docs/api.md "API keys"): removing them from the organization revokes it, with an audit row."""
    from lab.audit import Actor
    from lab.models import AuditLogEntry
    from lab.services import membership_remove

    result = run("--org", "acme", "--project", "rl", "--email", "ada@example.com")
    ada = User.objects.get(email="ada@example.com")
    api_key = ApiKey.objects.get()
    assert api_key.created_by == ada
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {result['api_key']}")
    assert client.get("/api/v1/whoami").status_code == 200
    grace = User.objects.create_user(email="grace@example.com")
    organization = Organization.objects.get(slug="acme")
    Membership.objects.create(organization=organization, user=grace, role=Role.OWNER)

    assert membership_remove(actor=Actor(user=grace), membership=Membership.objects.get(user=ada)) == 1

    response = client.get("/api/v1/whoami")
    assert (response.status_code, response.json()["error"]["code"]) == (401, "invalid_api_key")
    assert ApiKey.objects.get(pk=api_key.pk).revoked_at is not None
    row = AuditLogEntry.objects.get(action="api_key.revoke")
    assert (row.target, row.actor_user, row.data) == (
        api_key.public_id, grace, {"reason": "membership.remove", "created_by": "ada@example.com"}
    )


def test_it_makes_no_key_for_a_plain_member_of_an_existing_organization():
    run("--org", "acme", "--project", "rl", "--email", "ada@example.com")
    grace = User.objects.create_user(email="grace@example.com")
    Membership.objects.create(organization=Organization.objects.get(slug="acme"), user=grace, role=Role.MEMBER)

    with pytest.raises(CommandError) as excinfo:
        run("--org", "acme", "--project", "other", "--email", "grace@example.com")

    assert str(excinfo.value) == (
        "grace@example.com is a member of acme, not an owner or admin: an API key acts for its creator, who must be one"
    )
    assert ApiKey.objects.count() == 1
    assert not Project.objects.filter(slug="other").exists()
