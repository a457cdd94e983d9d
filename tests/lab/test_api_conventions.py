"""The REST conventions every endpoint shares: auth, scopes, tenancy, errors, limits, idempotency."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from lab.audit import Actor
from lab.models import ApiKey
from lab.services import api_key_create, api_key_revoke

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.lab.urls_for_tests")]


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"type", "code", "message", "param", "errors"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def test_it_answers_whoami(owner):
    response = owner.client().get("/api/v1/whoami")
    assert response.status_code == 200
    assert response.json() == {
        "organization": {"id": owner.organization.public_id, "slug": "acme", "name": "Acme"},
        "project": {"id": owner.project.public_id, "slug": "default", "name": "Default"},
        "scopes": ["read", "write"],
    }
    assert owner.organization.public_id.startswith("org_")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer lab_unknownkeyunknownkeyunknownkey",
        "Bearer not-a-lab-key",
        "Bearer lab_" + "x" * 500,
        "Bearer a b",
        "Token lab_abc",
    ],
)
def test_it_refuses_missing_malformed_and_unknown_keys(owner, header):
    client = APIClient()
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    error = assert_error(client.get("/api/v1/whoami"), 401, "invalid_api_key")
    assert error["type"] == "authentication_error"


def test_it_refuses_non_ascii_authorization_header(owner):
    client = APIClient()
    response = client.get("/api/v1/whoami", HTTP_AUTHORIZATION="Bearer lab_é".encode().decode("latin-1"))
    assert_error(response, 401, "invalid_api_key")


def test_it_refuses_a_revoked_key(owner):
    api_key_revoke(actor=Actor(user=owner.user), api_key=owner.api_key)
    assert_error(owner.client().get("/api/v1/whoami"), 401, "invalid_api_key")


def test_it_records_last_use(owner):
    assert ApiKey.objects.get(pk=owner.api_key.pk).last_used_at is None
    owner.client().get("/api/v1/whoami")
    assert ApiKey.objects.get(pk=owner.api_key.pk).last_used_at is not None


def test_a_read_key_reads_but_cannot_write(owner):
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    client = owner.client(read_key)
    assert client.get("/api/v1/whoami").json()["scopes"] == ["read"]
    assert client.get("/api/v1/test-keys").status_code == 200
    count = ApiKey.objects.count()
    error = assert_error(client.post("/api/v1/test-keys", {"name": "x"}, format="json"), 403, "insufficient_scope")
    assert error["type"] == "permission_error"
    assert ApiKey.objects.count() == count


def test_another_tenants_object_is_a_404_like_a_missing_one(owner, outsider):
    foreign = assert_error(outsider.client().get(f"/api/v1/test-keys/{owner.api_key.public_id}"), 404, "not_found")
    missing = assert_error(outsider.client().get("/api/v1/test-keys/key_doesnotexist"), 404, "not_found")
    assert foreign == missing
    own = outsider.client().get(f"/api/v1/test-keys/{outsider.api_key.public_id}")
    assert own.status_code == 200


def test_lists_are_enveloped_and_never_show_other_tenants(owner, outsider):
    body = outsider.client().get("/api/v1/test-keys").json()
    assert body == {"object": "list", "data": [{"id": outsider.api_key.public_id, "name": "test"}], "has_more": False}


def test_list_pagination_pages_by_cursor(owner):
    for index in range(4):
        api_key_create(actor=Actor(user=owner.user), project=owner.project, name=f"k{index}")
    client = owner.client()
    first = client.get("/api/v1/test-keys?limit=2").json()
    assert [item["name"] for item in first["data"]] == ["k3", "k2"]
    assert first["has_more"] is True
    second = client.get(f"/api/v1/test-keys?limit=2&after={first['data'][-1]['id']}").json()
    assert [item["name"] for item in second["data"]] == ["k1", "k0"]
    assert second["has_more"] is True
    third = client.get(f"/api/v1/test-keys?limit=2&after={second['data'][-1]['id']}").json()
    assert [item["name"] for item in third["data"]] == ["test"]
    assert third["has_more"] is False


@pytest.mark.parametrize("limit", ["0", "101", "-1", "abc", "1e3", "99999999999999999999"])
def test_it_refuses_bad_limits(owner, limit):
    error = assert_error(owner.client().get(f"/api/v1/test-keys?limit={limit}"), 400, "invalid_request")
    assert error["param"] == "limit"


def test_an_after_cursor_of_another_tenant_is_a_404(owner, outsider):
    assert_error(outsider.client().get(f"/api/v1/test-keys?after={owner.api_key.public_id}"), 404, "not_found")


@pytest.mark.parametrize("body", [b"{", b"[1,", b"\xff\xfe", b'{"name": NaN'])
def test_it_refuses_malformed_json(owner, body):
    count = ApiKey.objects.count()
    response = owner.client().post("/api/v1/test-keys", data=body, content_type="application/json")
    assert_error(response, 400, "invalid_request")
    assert ApiKey.objects.count() == count


def test_it_refuses_bodies_over_one_megabyte(owner):
    count = ApiKey.objects.count()
    body = json.dumps({"name": "x" * (1024 * 1024)})
    response = owner.client().post("/api/v1/test-keys", data=body, content_type="application/json")
    error = assert_error(response, 413, "request_too_large")
    assert error["type"] == "invalid_request_error"
    assert ApiKey.objects.count() == count


@override_settings(LAB_API_RATE_LIMIT_PER_MINUTE=5)
def test_a_flood_from_one_key_gets_429_with_retry_after(owner, outsider):
    client = owner.client()
    statuses = [client.get("/api/v1/whoami").status_code for _ in range(7)]
    assert statuses == [200] * 5 + [429] * 2
    response = client.get("/api/v1/whoami")
    assert_error(response, 429, "rate_limited")
    assert 1 <= int(response["Retry-After"]) <= 60
    # Another key is counted on its own.
    assert outsider.client().get("/api/v1/whoami").status_code == 200


@override_settings(
    LAB_API_RATE_LIMIT_PER_MINUTE=1,
    CACHES={
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens there
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    },
)
def test_an_unreachable_rate_limit_cache_lets_requests_through(owner, caplog):
    client = owner.client()
    assert [client.get("/api/v1/whoami").status_code for _ in range(3)] == [200, 200, 200]
    assert "rate limit not counted" in caplog.text


def test_every_response_carries_a_request_id(owner):
    response = owner.client().get("/api/v1/whoami", HTTP_X_REQUEST_ID="abc-123")
    assert response["X-Request-Id"] == "abc-123"
    generated = APIClient().get("/api/v1/whoami", HTTP_X_REQUEST_ID="bad id\nwith newline")
    assert len(generated["X-Request-Id"]) == 32
    assert APIClient().get("/healthz")["X-Request-Id"]


def test_an_idempotency_key_replays_the_original_answer(owner):
    client = owner.client()
    first = client.post("/api/v1/test-keys", {"name": "once"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    second = client.post("/api/v1/test-keys", {"name": "once"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    assert ApiKey.objects.filter(name="once").count() == 1


def test_an_idempotency_key_with_another_body_is_a_conflict(owner):
    client = owner.client()
    client.post("/api/v1/test-keys", {"name": "one"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    response = client.post("/api/v1/test-keys", {"name": "two"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert_error(response, 409, "idempotency_conflict")
    assert not ApiKey.objects.filter(name="two").exists()


def test_idempotency_keys_are_per_project(owner, outsider):
    owner.client().post("/api/v1/test-keys", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    response = outsider.client().post("/api/v1/test-keys", {"name": "b"}, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    assert response.status_code == 201
    assert ApiKey.objects.get(name="b").project == outsider.project


def test_it_refuses_an_overlong_idempotency_key(owner):
    response = owner.client().post("/api/v1/test-keys", {"name": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="k" * 300)
    assert_error(response, 400, "invalid_request")
    assert not ApiKey.objects.filter(name="a").exists()


def test_unknown_api_paths_answer_the_error_body(owner):
    assert_error(owner.client().get("/api/v1/nothing-here"), 404, "not_found")


def test_the_openapi_schema_is_served():
    response = APIClient().get("/api/v1/schema", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert "/api/v1/whoami" in response.content.decode()
