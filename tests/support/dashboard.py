"""Helpers shared by the dashboard tests."""

from __future__ import annotations

import re

from django.core import mail
from django.test import Client


def signed_in(user) -> Client:
    """Return a test client with ``user`` signed in."""
    client = Client()
    client.force_login(user)
    return client


def link_in_last_email(pattern: str) -> str:
    """Return the first match of ``pattern`` in the body of the last email sent."""
    assert mail.outbox, "no email was sent"
    match = re.search(pattern, mail.outbox[-1].body)
    assert match, mail.outbox[-1].body
    return match.group(0)


def without_csrf(response) -> str:
    """The page of ``response`` with its (per-render) CSRF tokens blanked out, to compare two pages."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", response.content.decode())
