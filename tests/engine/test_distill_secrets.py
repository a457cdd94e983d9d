"""A teacher secret that cannot travel as an HTTP header value (engine/distill.py): before, a
line break or NUL failed every request as a network error and a non-ASCII character raised
inside httpx, so the attempt crashed and Lab retried it; now it is a TeacherRefused (exit 2,
``invalid_spec``) naming the secret and never its value."""

from __future__ import annotations

import pytest
from labsdk.spec import parse_spec

from engine.distill import TeacherClient, TeacherRefused

from .conftest import tiny_spec


def teacher(**client):
    client = {"base_url": "http://127.0.0.1:9/v1", "api_key_var": "TEACHER_KEY", **client}
    return parse_spec({**tiny_spec(), "loss": "sft", "teacher": {"model": "big/teacher", "client": client}}).spec.teacher


@pytest.mark.parametrize("value", ["sk-abc\n", "sk-abc\r\nX-Injected: 1", "sk-\x00abc", "sk-\x7fabc", "sk-clé"])
def test_a_key_that_is_no_header_value_is_refused_naming_the_secret_not_its_value(value):
    with pytest.raises(TeacherRefused) as refused:
        TeacherClient.from_spec(teacher(), {"TEACHER_KEY": value})
    assert "TEACHER_KEY" in str(refused.value) and value not in str(refused.value)


def test_a_header_secret_that_is_no_header_value_is_refused_too():
    spec = teacher(headers_from_env={"X-Team": "TEAM"})
    with pytest.raises(TeacherRefused, match=r"the job secret\(s\) TEAM cannot be sent"):
        TeacherClient.from_spec(spec, {"TEACHER_KEY": "sk-ok", "TEAM": "a\nb"})


def test_spaces_and_tabs_inside_a_value_are_sent():
    client = TeacherClient.from_spec(teacher(headers_from_env={"X-Team": "TEAM"}), {"TEACHER_KEY": "sk-ok", "TEAM": "a b\tc"})
    try:
        assert client._client.headers["X-Team"] == "a b\tc"
        assert client._client.headers["Authorization"] == "Bearer sk-ok"
    finally:
        client.close()
