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
