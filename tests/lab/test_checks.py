"""Lab's system checks: ``manage.py check --deploy`` warns about settings unfit for production."""

from __future__ import annotations

import pytest
from django.core import checks

MAIL_CHECK = "lab.W001"


def deploy_warnings() -> list[checks.CheckMessage]:
    """What ``check --deploy`` reports from Lab's own checks."""
    return [
        message
        for message in checks.run_checks(include_deployment_checks=True, tags=[checks.Tags.security])
        if message.id.startswith("lab.")
    ]


@pytest.mark.parametrize(
    "backend, name",
    [
        ("django.core.mail.backends.console.EmailBackend", "console"),
        ("django.core.mail.backends.dummy.EmailBackend", "dummy"),
        ("django.core.mail.backends.locmem.EmailBackend", "locmem"),
    ],
)
def test_it_warns_when_mail_is_not_sent(settings, backend, name):
    settings.EMAIL_BACKEND = backend

    [warning] = deploy_warnings()

    assert warning.id == MAIL_CHECK
    assert warning.level == checks.WARNING
    assert warning.msg == (
        f"EMAIL_BACKEND is Django's {name} backend: invitation and password-reset emails, links "
        "included, are not sent" + (" but written to the web server's log." if name == "console" else ".")
    )
    assert warning.hint == (
        "Set EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend and EMAIL_HOST, EMAIL_PORT, "
        "EMAIL_HOST_USER, EMAIL_HOST_PASSWORD, EMAIL_USE_TLS and DEFAULT_FROM_EMAIL (README: Configuration)."
    )


def test_it_is_silent_with_smtp(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "smtp.example.com"

    assert deploy_warnings() == []


def test_it_only_runs_with_deploy(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

    assert [message.id for message in checks.run_checks() if message.id.startswith("lab.")] == []
