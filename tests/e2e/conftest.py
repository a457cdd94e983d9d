"""Fixtures for the end-to-end API tests: tenants made through services and a live HTTP server.

The SDK, the CLI and the fuzzers talk to pytest-django's ``live_server`` over real sockets, so
every test here needs ``@pytest.mark.django_db(transaction=True)``: the server thread must see
committed rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from labsdk import Lab

from lab.audit import Actor
from lab.services import api_key_create
from tests.conftest import Tenant, make_tenant

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TINY = REPO / "examples" / "addition-tiny.toml"

@pytest.fixture
def tiny_toml() -> Path:
    """``examples/addition-tiny.toml``."""
    return EXAMPLE_TINY


@pytest.fixture(autouse=True)
def _seeded_prices(default_prices) -> None:
    """Put back the price table: a transactional test flushes every table afterwards, rows of
    data migrations included, so only the first such test in a run would otherwise see prices."""


@pytest.fixture
def tenant(transactional_db, _fast_password_hashing) -> Tenant:
    """The owner of organization "Acme" with project "default" and a read-write key."""
    return make_tenant("e2e-owner@acme.test", "Acme")


@pytest.fixture
def outsider(transactional_db, _fast_password_hashing) -> Tenant:
    """The owner of another organization, "Globex"."""
    return make_tenant("e2e-outsider@globex.test", "Globex")


@pytest.fixture
def read_key(tenant: Tenant) -> str:
    """A read-only API key of the tenant's project."""
    _, key = api_key_create(actor=Actor(user=tenant.user), project=tenant.project, name="read", scopes=["read"])
    return key


@pytest.fixture
def lab(live_server, tenant: Tenant) -> Lab:
    """The real SDK pointed at the live server with the tenant's key."""
    with Lab(api_key=tenant.key, base_url=live_server.url, timeout=10, max_retries=2) as client:
        yield client
