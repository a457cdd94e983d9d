"""Dashboard fixtures: Django test clients signed in as the owner, the member and the outsider."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client


def signed_in(user) -> Client:
    """Return a test client with ``user`` signed in."""
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_client(owner) -> Client:
    """The owner of Acme, signed in."""
    return signed_in(owner.user)


@pytest.fixture
def member_client(member) -> Client:
    """A plain member of Acme, signed in."""
    return signed_in(member)


@pytest.fixture
def outsider_client(outsider) -> Client:
    """The owner of Globex, signed in; Acme's pages must all be 404 for them."""
    return signed_in(outsider.user)


def link_in_last_email(pattern: str) -> str:
    """Return the first path matching ``pattern`` in the body of the last email sent."""
    assert mail.outbox, "no email was sent"
    match = re.search(pattern, mail.outbox[-1].body)
    assert match, mail.outbox[-1].body
    return match.group(0)


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Hash passwords cheaply: these tests sign up and log in dozens of users."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
