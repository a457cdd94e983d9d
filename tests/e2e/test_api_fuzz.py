"""Fuzzing the REST API on a live server: nothing a client sends may end in a 5xx, and every
answer is one the OpenAPI document describes (status, content type, headers, body schema).

Two fuzzers, both bounded and deterministic (fixed example counts, ``derandomize``):

* schemathesis over the OpenAPI document served at ``/api/v1/schema``, every operation, with
  valid (positive) and invalid (negative) inputs; then once more over the operations that create
  (``POST /jobs``, ``/jobs/estimate``, ``/webhook-endpoints``) with the model and environment ids
  narrowed to this Lab's catalogues, so that schema-valid bodies are accepted, not only refused;
* hypothesis-built hostile job specs for ``POST /jobs`` and ``POST /jobs/estimate``: wrong
  types, huge and negative numbers, long and odd unicode strings, nesting, unknown keys. They
  must be refused (400 or 413) or accepted, never 5xx, and a refused body creates no job.

NUL characters in paths and query strings and JSON nested past the parser's recursion limit
have their own regression tests at the end, so the fuzzers leave them out.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks
from schemathesis.errors import FailureGroup

from jobs.models import Job
from jobs.webhooks.models import WebhookEndpoint
from tests.conftest import TINY_SPEC

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

#: Examples per operation and generation mode for schemathesis; per endpoint for the spec fuzzer.
SCHEMA_EXAMPLES = 10
SPEC_EXAMPLES = 60

_FUZZ_SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(item) for item in value)
    return False


#: What every answer is checked for besides its status: it is documented, and matches the document.
CONFORMANCE_CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


def _conformance_failures(case, response) -> list[str]:
    """Return schemathesis' conformance failures of ``response`` to ``case`` (none when it conforms)."""
    try:
        case.validate_response(response, checks=CONFORMANCE_CHECKS)
    except FailureGroup as group:
        return [
            f"{case.method} {case.formatted_path}: {failure.title}: {failure.message[:300]}"
            for failure in group.exceptions
        ]
    return []


def _describe(method: str, path: str, query: Any, body: Any, response: httpx.Response | Any) -> str:
    text = getattr(response, "text", "")
    return f"{method} {path} query={query!r} body={str(body)[:300]!r} -> {response.status_code} {text[:300]}"


# --- schemathesis over the OpenAPI document ---------------------------------------------------


def test_every_operation_answers_as_documented_never_5xx(live_server, tenant):
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/v1/schema")
    operations = [result.ok() for result in schema.get_all_operations()]
    headers = {"Authorization": f"Bearer {tenant.key}"}
    failures: list[str] = []
    calls = 0

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=SCHEMA_EXAMPLES, **_FUZZ_SETTINGS)
            @given(case=operation.as_strategy(mode))
            def check(case):
                nonlocal calls
                if any(_has_nul(part) for part in (case.path_parameters, case.query)):
                    return  # known bug, see test_nul_characters_in_a_path_or_query_are_refused_not_500
                calls += 1
                response = case.call(base_url=live_server.url, headers=headers, timeout=30)
                if response.status_code >= 500:
                    failures.append(
                        _describe(case.method, case.formatted_path, case.query, case.body, response)
                    )
                failures.extend(_conformance_failures(case, response))

            try:
                check()
            except Unsatisfiable:
                # Nothing to make invalid (an operation without parameters or body).
                assert mode == GenerationMode.NEGATIVE, operation.label

    assert len(operations) >= 12, [operation.label for operation in operations]
    assert calls >= len(operations) * SCHEMA_EXAMPLES
    assert failures == []


#: The operations that create, what they create, and their answer when they accept a body.
_CREATING = {
    "/api/v1/jobs": (Job.objects.unscoped, 201),
    "/api/v1/jobs/estimate": (Job.objects.unscoped, 200),
    "/api/v1/webhook-endpoints": (WebhookEndpoint.objects.unscoped().all, 201),
}


def _catalogue_openapi(base_url: str, key: str) -> dict:
    """Return the served OpenAPI document cut to the ``POST`` operations of ``_CREATING``, with
    the job spec's model and environment ids narrowed to this Lab's catalogues (which no static
    schema can know) so that schema-valid specs name installed ones, and webhook URLs to public
    addresses."""
    headers = {"Authorization": f"Bearer {key}"}
    document = httpx.get(f"{base_url}/api/v1/schema", params={"format": "json"}).json()
    models = [model["id"] for model in httpx.get(f"{base_url}/api/v1/models", headers=headers).json()["data"]]
    environments = [env["id"] for env in httpx.get(f"{base_url}/api/v1/environments", headers=headers).json()["data"]]
    components = document["components"]["schemas"]
    for body in ("JobSpec", "JobCreate"):  # POST /jobs takes JobCreate: the spec's keys and secrets
        components[body]["properties"]["model"] = {"enum": models}
    components["EnvConfig"]["properties"]["id"] = {"enum": environments}
    # A block names its environment by id or by a v1 taskset's id; positive cases use the first.
    components["EnvConfig"]["required"] = ["id"]
    # Public addresses, as no static schema can tell which hosts resolve to private ones.
    public_url = r"^https://93\.184\.215\.[1-9][0-9]?/[a-z]{0,9}$"
    components["WebhookEndpointCreate"]["properties"]["url"] = {"type": "string", "pattern": public_url}
    document["paths"] = {path: {"post": document["paths"][path]["post"]} for path in _CREATING}
    return document


def test_creating_bodies_are_accepted_or_refused_as_documented_never_5xx(live_server, tenant):
    schema = schemathesis.openapi.from_dict(_catalogue_openapi(live_server.url, tenant.key))
    headers = {"Authorization": f"Bearer {tenant.key}"}
    failures: list[str] = []
    statuses: dict[str, list[int]] = {path: [] for path in _CREATING}

    for operation in (result.ok() for result in schema.get_all_operations()):
        rows, accepted = _CREATING[operation.path]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=SCHEMA_EXAMPLES, **_FUZZ_SETTINGS)
            @given(case=operation.as_strategy(mode))
            def check(case):
                before = rows().count()
                response = case.call(base_url=live_server.url, headers=headers, timeout=30)
                created = rows().count() - before
                failures.extend(_conformance_failures(case, response))
                if response.request.headers.get("Authorization") != headers["Authorization"]:
                    # A negative case about authentication itself: it must be refused and change nothing.
                    if response.status_code != 401 or created:
                        failures.append(_describe(case.method, case.formatted_path, None, case.body, response))
                    return
                statuses[operation.path].append(response.status_code)
                replayed = response.headers.get("Idempotent-Replayed") == "true"
                expected_created = 1 if response.status_code == accepted == 201 and not replayed else 0
                # 409: the generated Idempotency-Key was already used with another body.
                if response.status_code not in (accepted, 400, 409, 413) or created != expected_created:
                    failures.append(
                        f"{created} created: " + _describe(case.method, case.formatted_path, None, case.body, response)
                    )

            check()

    assert failures == []
    for path, (_, accepted) in _CREATING.items():
        assert accepted in statuses[path] and 400 in statuses[path], (path, sorted(set(statuses[path])))


# --- hostile job specs ------------------------------------------------------------------------

_SPEC_PATHS = [
    ("name",), ("model",), ("max_steps",), ("batch_size",), ("rollouts_per_example",), ("learning_rate",),
    ("lora_alpha",), ("lora_rank",), ("seed",), ("max_restarts",), ("max_off_policy_steps",), ("priority",),
    ("max_runtime_minutes",), ("init_from",), ("sampling",), ("sampling", "max_tokens"),
    ("sampling", "temperature"), ("env",), ("env", 0), ("env", 0, "id"), ("env", 0, "args"),
    ("env", 0, "args", "max_operand"), ("eval",), ("eval", "interval"), ("checkpoints",),
    ("checkpoints", "keep_last"), ("resources",), ("resources", "gpu_type"), ("resources", "gpus"),
    ("metadata",), ("metadata", "team"), ("wandb",), ("oversampling_factor",), ("colour",),
]

_text = st.text(max_size=40) | st.sampled_from(
    ["", " ", "x" * 5000, "é" * 300, "🚀" * 100, "\u202e", "../../etc", "lab/addition\n", "a\x00b", "\ud800", "x\udfff"]
)
_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 2**31, 2**63, 10**300, -(10**300)])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e308, -1e308, 5e-324, 0.5])
    | _text
)
_hostile = st.recursive(
    _leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=12,
) | st.integers(min_value=1, max_value=400).map(lambda depth: _nest(depth))


def _nest(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


def _set_path(spec: dict, path: tuple, value: Any) -> dict:
    target: Any = spec
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return spec


@st.composite
def hostile_specs(draw) -> Any:
    """A valid tiny spec with one to three places replaced by hostile values, or a hostile body."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_hostile)
    spec = copy.deepcopy(TINY_SPEC)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_SPEC_PATHS))
        try:
            _set_path(spec, path, draw(_hostile))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed the parent
    return spec


@pytest.mark.parametrize("endpoint", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
def test_hostile_specs_are_refused_or_accepted_never_5xx(live_server, tenant, endpoint):
    client = httpx.Client(
        base_url=live_server.url, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=30
    )
    accepted_status = 201 if endpoint == "/api/v1/jobs" else 200
    failures: list[str] = []
    seen: set[int] = set()

    @settings(max_examples=SPEC_EXAMPLES, **_FUZZ_SETTINGS)
    @given(body=hostile_specs())
    def check(body):
        before = Job.objects.unscoped().count()
        content = json.dumps(body, allow_nan=False).encode()
        response = client.post(endpoint, content=content, headers={"Content-Type": "application/json"})
        created = Job.objects.unscoped().count() - before
        seen.add(response.status_code)
        if response.status_code == accepted_status:
            if created != (1 if accepted_status == 201 else 0):
                failures.append(f"{created} jobs created: " + _describe("POST", endpoint, None, body, response))
        elif response.status_code in (400, 413):
            error = response.json()["error"]
            if created != 0 or error["code"] not in ("invalid_spec", "invalid_request", "request_too_large"):
                failures.append(f"{created} jobs created: " + _describe("POST", endpoint, None, body, response))
        else:
            failures.append(_describe("POST", endpoint, None, body, response))

    with client:
        check()

    assert failures == []
    assert 400 in seen


# --- regressions of bugs the fuzzers found --------------------------------------------------------------------


def _deep_json(depth: int) -> bytes:
    return b'{"model": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("endpoint", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
def test_json_nested_too_deep_is_a_400_not_500(live_server, tenant, endpoint):
    response = httpx.post(
        live_server.url + endpoint,
        content=_deep_json(100_000),
        headers={"Authorization": f"Bearer {tenant.key}", "Content-Type": "application/json"},
        timeout=30,
    )

    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in ("invalid_request", "invalid_spec")
    assert not Job.objects.unscoped().exists()


_NUL_REQUESTS = [
    ("GET", "/api/v1/jobs/job_a%00b", None),
    ("POST", "/api/v1/jobs/job_a%00b/cancel", None),
    ("GET", "/api/v1/jobs/job_a%00b/events", None),
    ("GET", "/api/v1/jobs", {"after": "job_\x00"}),
    ("GET", "/api/v1/jobs/{job}/checkpoints", {"after": "ckpt_\x00"}),
    ("GET", "/api/v1/jobs", {"metadata[team]": "a\x00"}),
    ("GET", "/api/v1/jobs", {"metadata[te\x00am]": "a"}),
]


@pytest.mark.parametrize(
    ("method", "path", "query"),
    _NUL_REQUESTS,
    ids=["get-id", "cancel-id", "events-id", "jobs-after", "checkpoints-after", "metadata-value", "metadata-key"],
)
def test_nul_characters_in_a_path_or_query_are_refused_not_500(live_server, tenant, method, path, query):
    headers = {"Authorization": f"Bearer {tenant.key}"}
    if "{job}" in path:
        job = httpx.post(f"{live_server.url}/api/v1/jobs", json=TINY_SPEC, headers=headers).json()["id"]
        path = path.format(job=job)

    response = httpx.request(method, live_server.url + path, params=query, headers=headers, timeout=30)

    assert response.status_code in (400, 404), response.text


@pytest.mark.parametrize("endpoint", ["/api/v1/jobs", "/api/v1/jobs/estimate"])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ('"name": "a\\u0000b"', "name"),
        ('"metadata": {"team": "a\\u0000"}', "metadata.team"),
        ('"wandb": {"project": "\\ud800"}', "wandb.project"),
        ('"trajectory_strategy": "\\udfff"', "trajectory_strategy"),
        ('"env_files": ["\\ud800"]', "env_files.0"),
    ],
    ids=["nul-name", "nul-metadata", "surrogate-wandb", "surrogate-prime-key", "surrogate-list"],
)
def test_strings_a_database_cannot_store_are_an_invalid_spec(live_server, tenant, endpoint, extra, param):
    body = json.dumps({key: value for key, value in TINY_SPEC.items() if key not in ("name", "metadata")})
    body = body[:-1] + ", " + extra + "}"

    response = httpx.post(
        live_server.url + endpoint,
        content=body.encode(),
        headers={"Authorization": f"Bearer {tenant.key}", "Content-Type": "application/json"},
        timeout=30,
    )

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_spec", param)
    assert not Job.objects.unscoped().exists()
