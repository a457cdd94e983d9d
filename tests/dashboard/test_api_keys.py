"""API keys in the dashboard: created with the secret shown once, listed, revoked after confirming."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from lab.models import ApiKey, AuditLogEntry
from serving.api.gateway import caller

pytestmark = pytest.mark.django_db

KEYS = "/o/acme/p/default/keys/"


def create_key(client, name: str = "laptop", access: str = "read_write"):
    return client.post(KEYS, {"name": name, "access": access})


def plaintext_in(response) -> str:
    match = re.search(r'<code id="new-api-key">(lab_[\w-]+)</code>', response.content.decode())
    assert match, "the new key is not on the page"
    return match.group(1)


def whoami(key: str):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client.get("/api/v1/whoami")


def test_it_shows_a_new_key_exactly_once(owner, owner_client):
    response = create_key(owner_client)
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    key = plaintext_in(response)
    api_key = ApiKey.objects.get(name="laptop")
    assert key.startswith(api_key.prefix)
    assert api_key.scopes == ["read", "write"]
    assert api_key.key_hash != key and key not in api_key.key_hash
    assert whoami(key).json()["scopes"] == ["read", "write"]

    reloaded = owner_client.get(KEYS)
    assert reloaded.status_code == 200
    assert key not in reloaded.content.decode()
    assert 'id="new-api-key"' not in reloaded.content.decode()
    assert f"{api_key.prefix}…" in reloaded.content.decode()


def test_it_creates_a_read_only_key(owner, owner_client):
    key = plaintext_in(create_key(owner_client, name="dashboards", access="read"))
    assert ApiKey.objects.get(name="dashboards").scopes == ["read"]
    assert whoami(key).json()["scopes"] == ["read"]


def test_it_creates_an_inference_only_key_that_calls_models_and_nothing_else(owner, owner_client):
    page = owner_client.get(KEYS).content.decode()
    assert 'value="inference"' in page
    key = plaintext_in(create_key(owner_client, name="product", access="inference"))
    assert ApiKey.objects.get(name="product").scopes == ["inference"]
    assert caller(f"Bearer {key}").name == "product"  # what the OpenAI-compatible API admits
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    refused = client.get("/api/v1/jobs")
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "insufficient_scope")


def test_it_refuses_a_bad_create_form(owner, owner_client):
    response = create_key(owner_client, name="", access="admin")
    assert response.status_code == 200
    assert set(response.context["form"].errors) == {"name", "access"}
    assert 'id="new-api-key"' not in response.content.decode()
    assert ApiKey.objects.count() == 1


def test_it_lists_keys_with_prefix_scopes_and_last_use(owner, owner_client):
    whoami(owner.key)
    page = owner_client.get(KEYS)
    content = page.content.decode()
    assert [key.public_id for key in page.context["keys"]] == [owner.api_key.public_id]
    assert f"{owner.api_key.prefix}…" in content
    assert owner.key not in content
    assert "read, write" in content
    assert "never" not in content  # last used just now


def test_it_revokes_a_key_after_confirming_and_the_api_refuses_it(owner, owner_client):
    key = plaintext_in(create_key(owner_client))
    api_key = ApiKey.objects.get(name="laptop")
    assert whoami(key).status_code == 200
    revoke_url = f"{KEYS}{api_key.public_id}/revoke/"

    confirm = owner_client.get(revoke_url)
    assert confirm.status_code == 200
    assert b"Revoke the key" in confirm.content
    api_key.refresh_from_db()
    assert api_key.revoked_at is None

    response = owner_client.post(revoke_url)
    assert response.status_code == 302 and response["Location"] == KEYS
    api_key.refresh_from_db()
    assert api_key.revoked_at is not None
    refused = whoami(key)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    # The other key still works, and the page marks the revoked one.
    assert whoami(owner.key).status_code == 200
    assert b"revoked" in owner_client.get(KEYS).content
    assert AuditLogEntry.objects.filter(action="api_key.revoke", target=api_key.public_id).count() == 1


def test_it_answers_404_for_an_unknown_or_foreign_key(owner, outsider, owner_client):
    assert owner_client.get(f"{KEYS}key_doesnotexist/revoke/").status_code == 404
    foreign = f"{KEYS}{outsider.api_key.public_id}/revoke/"
    assert owner_client.get(foreign).status_code == 404
    assert owner_client.post(foreign).status_code == 404
    outsider.api_key.refresh_from_db()
    assert outsider.api_key.revoked_at is None


def test_it_lets_a_member_see_keys_but_not_create_or_revoke(owner, member_client):
    page = member_client.get(KEYS)
    assert page.status_code == 200
    assert owner.api_key.prefix in page.content.decode()
    assert owner.key not in page.content.decode()
    assert create_key(member_client).status_code == 403
    revoke_url = f"{KEYS}{owner.api_key.public_id}/revoke/"
    assert member_client.get(revoke_url).status_code == 403
    assert member_client.post(revoke_url).status_code == 403
    assert ApiKey.objects.count() == 1
    owner.api_key.refresh_from_db()
    assert owner.api_key.revoked_at is None
    assert whoami(owner.key).status_code == 200
