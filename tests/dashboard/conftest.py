"""Dashboard fixtures: test clients signed in as the owner, the member and the outsider."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.dashboard import signed_in


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
