"""Event types, error codes and status reasons are named by their enums (``jobs.models``), never
spelled as raw strings where a job's event, failure or wait is recorded."""

from __future__ import annotations

import ast
from pathlib import Path

from jobs.models import ErrorCode, EventType, StatusReason

ROOT = Path(__file__).resolve().parents[2]

#: Keyword arguments that take a value of each enum (``job_transition(error_code=...)``,
#: ``job_record_event(type=...)``, ``Job(status_reason=...)``).
ENUM_OF_KEYWORD = {
    "type": EventType,
    "event_type": EventType,
    "error_code": ErrorCode,
    "reason": StatusReason,
    "status_reason": StatusReason,
}


def raw_vocabulary(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Return ``"path:line: keyword='value' (Enum.MEMBER)"`` for every such keyword given a raw string."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.keyword) and node.arg in ENUM_OF_KEYWORD):
                continue
            value, enum = node.value, ENUM_OF_KEYWORD[node.arg]
            if isinstance(value, ast.Constant) and value.value in enum.values:
                member = f"{enum.__name__}.{enum(value.value).name}"
                found.append(f"{path.relative_to(root)}:{value.lineno}: {node.arg}={value.value!r} ({member})")
    return found


def test_it_finds_no_raw_event_type_error_code_or_reason():
    paths = [
        path
        for package in ("lab", "jobs", "billing", "environments", "dashboard")
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]
    assert raw_vocabulary(paths) == []


def test_it_reports_each_raw_value_with_its_member(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "job_transition(job=job, error_code='oom', reason='waiting')\n"
        "job_record_event(job=job, type='job.queued', level='info')\n"
        "job_record_event(job=job, type='custom.thing', error_code=ErrorCode.OOM)\n"
    )
    assert raw_vocabulary([source], tmp_path) == [
        "example.py:1: error_code='oom' (ErrorCode.OOM)",
        "example.py:1: reason='waiting' (StatusReason.WAITING)",
        "example.py:2: type='job.queued' (EventType.QUEUED)",
    ]
