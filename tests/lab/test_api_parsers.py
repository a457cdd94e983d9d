"""JSON request bodies nested deeper than ``lab.api.parsers.MAX_JSON_DEPTH``: a 400
``invalid_request`` that changes nothing, never a RecursionError (500) in whatever walks the body
next (``POST /jobs`` and ``/jobs/estimate`` crashed at 500 nested arrays, a 1 KB body)."""

from __future__ import annotations

import pytest

from jobs.models import Job
from lab.api.parsers import MAX_JSON_DEPTH, JSONTooDeep, check_json_depth, json_loads

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("commit_callbacks", "no_broker", "default_prices")]

TOO_DEEP = {
    "type": "invalid_request_error",
    "code": "invalid_request",
    "message": f"Malformed request body: the JSON body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels",
    "param": None,
    "errors": [],
}


def nested(depth: int) -> str:
    """Return JSON text of ``depth`` arrays, one inside the other."""
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 500, 5000])
def test_a_spec_nested_past_the_limit_is_a_400_that_creates_nothing(owner, path, depth):
    body = '{"name": "deep", "max_steps": ' + nested(depth) + "}"  # the object is one more level

    response = owner.client().post(path, body, content_type="application/json")

    assert response.status_code == 400, response.content
    assert response.json() == {"error": TOO_DEEP}
    assert Job.objects.unscoped().count() == 0


def test_a_spec_at_the_limit_reaches_validation(owner):
    body = '{"name": "deep", "max_steps": ' + nested(MAX_JSON_DEPTH - 1) + "}"

    response = owner.client().post("/api/v1/jobs", body, content_type="application/json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", "max_steps")
    assert {"param": "max_steps", "code": "too_deep",
            "message": "nested deeper than the 32 levels of tables and arrays a spec may have"} in error["errors"]
    assert Job.objects.unscoped().count() == 0


def test_a_valid_spec_is_still_created(owner, spec):
    response = owner.client().post("/api/v1/jobs", spec, format="json")

    assert response.status_code == 201, response.content


def test_check_json_depth_counts_objects_and_arrays_without_recursion():
    check_json_depth({"a": [{"b": 1}]}, max_depth=3)
    with pytest.raises(JSONTooDeep):
        check_json_depth({"a": [{"b": []}]}, max_depth=3)
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(JSONTooDeep):
        check_json_depth(deep)


def test_json_loads_refuses_nesting_the_decoder_cannot_read():
    assert json_loads(b'{"a": [1]}') == {"a": [1]}
    with pytest.raises(JSONTooDeep):
        json_loads(nested(100_000))
    with pytest.raises(JSONTooDeep):
        json_loads(nested(MAX_JSON_DEPTH + 1))
