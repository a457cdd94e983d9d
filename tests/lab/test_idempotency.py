"""lab.idempotency.run_once: one run per (project, key), a repeat answered as the first time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from lab.errors import LabError
from lab.idempotency import StoredAnswer, run_once
from lab.models import IdempotencyRecord

pytestmark = pytest.mark.django_db


def _once(owner, runs: list[int], *, key: str = "k-1", request_hash: str = "h1", status: int = 201):
    def work() -> int:
        runs.append(len(runs) + 1)
        return runs[-1]

    return run_once(
        project=owner.project,
        key=key,
        request_hash=request_hash,
        work=work,
        answer=lambda run: StoredAnswer(status, {"run": run}) if status < 500 else None,
        param="Idempotency-Key",
    )


def test_a_repeat_gets_the_stored_answer_and_the_work_runs_once(owner):
    runs: list[int] = []

    assert _once(owner, runs) == 1
    assert _once(owner, runs) == StoredAnswer(201, {"run": 1})
    assert runs == [1]


def test_the_same_key_with_another_request_is_a_conflict_that_changes_nothing(owner):
    runs: list[int] = []
    _once(owner, runs)

    with pytest.raises(LabError) as refused:
        _once(owner, runs, request_hash="h2")

    assert (refused.value.code, refused.value.param) == ("idempotency_conflict", "Idempotency-Key")
    assert refused.value.message == "This Idempotency-Key was already used with a different request."
    assert runs == [1]


def test_work_that_fails_or_answers_a_server_error_stores_nothing_and_may_run_again(owner):
    def failing() -> int:
        raise LabError("invalid_state", "not now")

    with pytest.raises(LabError):
        run_once(project=owner.project, key="k", request_hash="h", work=failing, answer=lambda _: StoredAnswer(200, {}))
    runs: list[int] = []
    assert _once(owner, runs, key="k", request_hash="h", status=503) == 1
    assert _once(owner, runs, key="k", request_hash="h") == 2
    assert IdempotencyRecord.objects.get(key="k").response_body == {"run": 2}


def test_keys_are_per_project_and_expire(owner, outsider, settings):
    runs: list[int] = []
    _once(owner, runs)
    assert _once(outsider, runs) == 2  # another project's key of the same name is another key
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(seconds=settings.LAB_IDEMPOTENCY_TTL_S + 1))
    assert _once(owner, runs, request_hash="other") == 3
