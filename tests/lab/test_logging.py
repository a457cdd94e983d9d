"""Lab's log lines: one JSON object per line; a refused request (4xx) is one line, no traceback."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from django.test import Client

from lab.audit import Actor
from lab.logging import JsonFormatter
from lab.services import api_key_create
from tests.support.dashboard import signed_in

pytestmark = pytest.mark.django_db


def console_formatter() -> logging.Formatter:
    """The formatter of the handler LOGGING configures (the one writing to stderr)."""
    [handler] = [handler for handler in logging.getLogger().handlers if isinstance(handler.formatter, JsonFormatter)]
    return handler.formatter


def django_lines(caplog) -> list[str]:
    """The records Django logged about requests, formatted as Lab's console handler writes them."""
    formatter = console_formatter()
    return [
        formatter.format(record)
        for record in caplog.records
        if record.name == "django.request" or record.name.startswith("django.security")
    ]


def test_a_permission_denied_page_logs_one_line(owner, member, caplog):
    caplog.set_level(logging.WARNING)

    response = signed_in(member).post("/o/acme/projects/", {"name": "Secret"})

    assert response.status_code == 403
    [line] = django_lines(caplog)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "WARNING",
        "django.request",
        "Forbidden (Permission denied): /o/acme/projects/",
    )
    assert "exception" not in entry
    assert entry["status_code"] == 403


def test_a_csrf_failure_logs_one_line(owner, caplog):
    caplog.set_level(logging.WARNING)

    response = Client(enforce_csrf_checks=True).post("/login/", {"username": "owner@acme.test", "password": "x"})

    assert response.status_code == 403
    [line] = django_lines(caplog)
    entry = json.loads(line)
    assert (entry["logger"], entry["message"]) == ("django.security.csrf", "Forbidden (CSRF cookie not set.): /login/")
    assert "exception" not in entry and "\n" not in line


def test_an_api_scope_refusal_logs_one_line(owner, spec, caplog):
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    caplog.set_level(logging.WARNING)

    response = owner.client(read_key).post("/api/v1/jobs", spec, format="json")

    assert response.status_code == 403
    [line] = django_lines(caplog)
    entry = json.loads(line)
    assert (entry["logger"], entry["message"], entry["status_code"]) == ("django.request", "Forbidden: /api/v1/jobs", 403)
    assert "exception" not in entry


def test_a_request_for_another_host_logs_one_line(db, caplog):
    caplog.set_level(logging.WARNING)

    response = Client().get("/login/", HTTP_HOST="lab.evil.example")

    assert response.status_code == 400
    [line] = django_lines(caplog)
    entry = json.loads(line)
    assert (entry["level"], entry["logger"]) == ("ERROR", "django.security.DisallowedHost")
    assert entry["message"].startswith("Invalid HTTP_HOST header: 'lab.evil.example'.")
    assert "exception" not in entry


def test_a_server_error_keeps_its_traceback():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord(
            "django.request", logging.ERROR, __file__, 1, "Internal Server Error: /x", None, sys.exc_info()
        )
    record.status_code = 500

    entry = json.loads(console_formatter().format(record))

    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("RuntimeError: boom")
