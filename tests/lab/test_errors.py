"""The domain error (``lab.errors.LabError``) and its one mapping to HTTP (``lab.api.errors``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from billing.accounts import Blocker
from lab.api.errors import STATUS_BY_CODE, ApiError, exception_handler, http_status, lab_error_body
from lab.errors import FieldError, LabError, not_found

ROOT = Path(__file__).resolve().parents[2]


def _raised_codes() -> dict[str, list[str]]:
    """Return every string literal given as the code of a ``LabError(...)`` in the apps, with where."""
    found: dict[str, list[str]] = {}
    for package in ("lab", "jobs", "billing", "environments", "dashboard"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "LabError"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.setdefault(node.args[0].value, []).append(where)
    return found


def test_it_knows_the_status_of_every_code_the_services_raise():
    codes = _raised_codes()
    assert {"not_found", "invalid_state", "invalid_request"} <= set(codes)
    unknown = {code: where for code, where in codes.items() if code not in STATUS_BY_CODE}
    assert unknown == {}
    # Codes made at run time: the billing blockers and the corrupted archives of each kind.
    blockers = (Blocker.INSUFFICIENT_CREDIT, Blocker.SPEND_LIMIT_REACHED, Blocker.PAYMENT_FAILED)
    assert {code: STATUS_BY_CODE[code] for code in blockers} == {
        "insufficient_credit": 402,
        "spend_limit_reached": 402,
        "payment_failed": 402,
    }
    assert (STATUS_BY_CODE["checkpoint_corrupted"], STATUS_BY_CODE["adapter_corrupted"]) == (409, 409)


def test_it_maps_the_codes_of_the_public_contract_to_their_statuses():
    assert {code: STATUS_BY_CODE[code] for code in (
        "invalid_request", "invalid_spec", "invalid_api_key", "insufficient_scope", "not_found",
        "idempotency_conflict", "invalid_state", "request_too_large", "rate_limited",
    )} == {
        "invalid_request": 400,
        "invalid_spec": 400,
        "invalid_api_key": 401,
        "insufficient_scope": 403,
        "not_found": 404,
        "idempotency_conflict": 409,
        "invalid_state": 409,
        "request_too_large": 413,
        "rate_limited": 429,
    }


def test_it_takes_the_first_field_as_param_unless_one_is_named():
    problems = [FieldError("env.0.id", "unknown", "No such environment."), FieldError("model", "missing", "Name one.")]
    assert LabError("invalid_spec", "2 problems.", errors=problems).param == "env.0.id"
    assert LabError("invalid_spec", "2 problems.", param="model", errors=problems).param == "model"
    assert LabError("invalid_state", "Ended.").param is None
    assert str(LabError("invalid_state", "Ended.")) == "Ended."


@pytest.mark.parametrize(
    ("error", "twin"),
    [
        (not_found("job"), ApiError(404, "not_found", "No such job.")),
        (
            LabError("invalid_spec", "1 problem.", errors=[FieldError("sampling.temperature", "range", "Too hot.")]),
            ApiError(400, "invalid_spec", "1 problem.", errors=[FieldError("sampling.temperature", "range", "Too hot.")]),
        ),
        (
            LabError("attempt_not_ready", "Not yet.", retry_after_s=5),
            ApiError(409, "attempt_not_ready", "Not yet.", headers={"Retry-After": "5"}),
        ),
        (LabError("spend_limit_reached", "Limit."), ApiError(402, "spend_limit_reached", "Limit.")),
    ],
)
def test_it_renders_a_domain_error_as_the_api_error_of_its_status(error, twin):
    rendered, expected = exception_handler(error, {}), exception_handler(twin, {})
    assert (rendered.status_code, rendered.data, dict(rendered.items())) == (
        expected.status_code,
        expected.data,
        dict(expected.items()),
    )
    assert lab_error_body(error) == twin.body()
    assert http_status(error) == twin.status


def test_it_renders_a_retry_after_and_the_error_body_exactly():
    response = exception_handler(LabError("attempt_not_ready", "Not yet.", param="attempt", retry_after_s=5), {})
    assert response.status_code == 409
    assert response["Retry-After"] == "5"
    assert response.data == {
        "error": {
            "type": "conflict_error",
            "code": "attempt_not_ready",
            "message": "Not yet.",
            "param": "attempt",
            "errors": [],
        }
    }
