"""Hostile job specs through ``POST /api/v1/jobs`` and ``/jobs/estimate``: a ``[teacher.client]``
the engine could never ask (a base_url that is not http(s), header names that are not HTTP
tokens or collide with the headers the engine sets) and a rollout filter setting whose key
cannot be stored are a 400 that creates nothing, never a job that fails every attempt or a 500."""

from __future__ import annotations

import pytest

from jobs.models import Job, JobSecrets

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker")]

SECRET = "sk-hostile-4f9c2e7a1b"


def sft(spec: dict, **client) -> dict:
    teacher = {"model": "t", "client": {"base_url": "https://api.example.com/v1", "api_key_var": "OPENAI_API_KEY", **client}}
    return {**spec, "loss": "sft", "teacher": teacher, "secrets": {"OPENAI_API_KEY": SECRET}}


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
@pytest.mark.parametrize(("client", "param"), [
    ({"base_url": "ftp://example.com/v1"}, "teacher.client.base_url"),
    ({"base_url": "file:///etc/passwd"}, "teacher.client.base_url"),
    ({"base_url": "http:///v1"}, "teacher.client.base_url"),
    ({"base_url": "api.example.com/v1"}, "teacher.client.base_url"),
    ({"base_url": "http://a b/v1"}, "teacher.client.base_url"),
    ({"base_url": "http://a.example/v1\r\nX-Injected: 1"}, "teacher.client.base_url"),
    ({"base_url": "https://user:pw@a.example/v1"}, "teacher.client.base_url"),
    ({"headers_from_env": {"Bad Name": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.Bad Name"),
    ({"headers_from_env": {"X\r\nY": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.X\r\nY"),
    ({"headers_from_env": {"X-Team:": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.X-Team:"),
    ({"headers_from_env": {"Authorization": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.Authorization"),
    ({"headers_from_env": {"authorization": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.authorization"),
    ({"headers_from_env": {"Host": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.Host"),
    ({"headers_from_env": {"Content-Length": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.Content-Length"),
    ({"headers_from_env": {"X-Team": "OPENAI_API_KEY", "x-team": "OPENAI_API_KEY"}}, "teacher.client.headers_from_env.x-team"),
])
def test_a_teacher_endpoint_the_engine_cannot_ask_is_a_400_that_creates_nothing(owner, spec, path, client, param):
    answer = owner.client().post(path, sft(spec, **client), format="json")

    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    assert [e["code"] for e in error["errors"]][0] in {"invalid_value", "duplicate_key"}
    assert SECRET not in answer.content.decode()
    assert Job.objects.unscoped().count() == 0 and JobSecrets.objects.unscoped().count() == 0


def test_a_valid_teacher_endpoint_with_extra_headers_is_accepted(owner, spec):
    body = sft(spec, base_url="http://[2606:4700:4700::1111]:8000/v1", headers_from_env={"X-Team-Id": "TEAM_ID", "OpenAI-Organization": "ORG"})
    body["secrets"].update(TEAM_ID="t-1", ORG="o-1")

    answer = owner.client().post("/api/v1/jobs", body, format="json")

    assert answer.status_code == 201, answer.content
    assert answer.json()["spec"]["teacher"]["client"]["headers_from_env"] == {"X-Team-Id": "TEAM_ID", "OpenAI-Organization": "ORG"}


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
def test_a_filter_setting_whose_key_holds_nul_is_a_400_not_a_500(owner, spec, path):
    spec["pre_batch_filters"] = [{"type": "gibberish", "a\x00b": 1}]

    answer = owner.client().post(path, spec, format="json")

    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["errors"] == [{
        "param": "pre_batch_filters.0.a\\x00b", "code": "invalid_value", "message": "key must not contain NUL characters",
    }]
    assert Job.objects.unscoped().count() == 0


def test_a_filter_setting_of_1e400_is_a_400(owner, spec):
    body = '{"name": "x", "model": "lab/tiny-random-llama", "env": [{"id": "lab/addition"}], ' \
           '"pre_batch_filters": [{"type": "gibberish", "max_nonprintable_fraction": 1e400}]}'

    answer = owner.client().post("/api/v1/jobs", body, content_type="application/json")

    assert answer.status_code == 400, answer.content
    assert Job.objects.unscoped().count() == 0


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
@pytest.mark.parametrize("value", ["sk-abc\n", "sk-abc\r\nX-Injected: 1", "sk-clé"])
def test_a_teacher_secret_that_cannot_be_a_header_value_is_a_400_that_never_echoes_it(owner, spec, path, value):
    body = sft(spec)
    body["secrets"]["OPENAI_API_KEY"] = value

    answer = owner.client().post(path, body, format="json")

    assert answer.status_code == 400, answer.content
    assert answer.json()["error"]["errors"] == [{
        "param": "teacher.client.api_key_var", "code": "invalid_secret",
        "message": "the secret 'OPENAI_API_KEY' is sent as an HTTP header and cannot be: it holds a line break, NUL, "
                   "another control character or a non-ASCII character",
    }]
    assert value not in answer.content.decode() and "sk-abc" not in answer.content.decode()
    assert Job.objects.unscoped().count() == 0 and JobSecrets.objects.unscoped().count() == 0
