"""Throttling of the sign-in, password-reset and sign-up forms (``lab.lockout``).

After a few failures an account, or a client address, is locked out; each further failure doubles
the lockout. A locked-out attempt is refused with 429, a ``Retry-After`` and a message saying when
to try again, before any password is checked: the right password is refused too.
"""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from lab import lockout
from lab.models import User
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

WRONG = "not-the-password-at-all"


@pytest.fixture
def clock(monkeypatch):
    """A clock the test moves by hand (seconds since the epoch)."""

    class Clock:
        now = 1_800_000_000.0

        def advance(self, seconds: float) -> None:
            self.now += seconds

    fake = Clock()
    monkeypatch.setattr(lockout, "_now", lambda: fake.now)
    return fake


def log_in(email: str, password: str, address: str = "198.51.100.7"):
    return Client(REMOTE_ADDR=address).post("/login/", {"username": email, "password": password})


def fail(times: int, email: str = "owner@acme.test", address: str = "198.51.100.7") -> None:
    for _ in range(times):
        response = log_in(email, WRONG, address)
        assert response.status_code == 200, response.status_code
        assert response.context["form"].non_field_errors() == [
            "Please enter a correct email and password. Note that both fields may be case-sensitive."
        ]


def test_it_refuses_the_right_password_after_too_many_wrong_ones(owner, clock):
    fail(5)

    response = log_in("owner@acme.test", PASSWORD)

    assert response.status_code == 429
    assert response["Retry-After"] == "30"
    assert response.context["form"].non_field_errors() == [
        "Too many failed sign-in attempts. Try again in 30 seconds."
    ]
    assert b"Too many failed sign-in attempts. Try again in 30 seconds." in response.content
    assert "_auth_user_id" not in response.wsgi_request.session


def test_it_lets_the_account_in_again_once_the_lockout_is_over(owner, clock):
    fail(5)
    clock.advance(31)

    response = log_in("owner@acme.test", PASSWORD)

    assert response.status_code == 302 and response["Location"] == "/"
    # Success forgets the account's failures: five more are allowed before the next lockout.
    fail(4)
    assert log_in("owner@acme.test", PASSWORD).status_code == 302


def test_it_doubles_the_lockout_with_each_further_failure(owner, clock):
    fail(5)
    waits = []
    for _ in range(6):
        refused = log_in("owner@acme.test", PASSWORD)
        assert refused.status_code == 429
        waits.append(int(refused["Retry-After"]))
        clock.advance(waits[-1])
        fail(1)
    assert waits == [30, 60, 120, 240, 480, 900]
    # The lockout stops growing at 15 minutes.
    refused = log_in("owner@acme.test", PASSWORD)
    assert refused["Retry-After"] == "900"
    assert refused.context["form"].non_field_errors() == [
        "Too many failed sign-in attempts. Try again in 15 minutes."
    ]


def test_it_forgets_failures_after_an_hour_without_one(owner, clock):
    fail(4)
    clock.advance(3601)
    fail(4)
    assert log_in("owner@acme.test", PASSWORD).status_code == 302


def test_it_leaves_another_account_from_another_address_unaffected(owner, outsider, clock):
    fail(5)
    assert log_in("owner@acme.test", PASSWORD).status_code == 429

    response = log_in("outsider@globex.test", PASSWORD, address="203.0.113.9")

    assert response.status_code == 302 and response["Location"] == "/"


def test_it_locks_the_account_out_from_every_address(owner, clock):
    for number in range(5):
        fail(1, address=f"198.51.100.{number}")

    assert log_in("owner@acme.test", PASSWORD, address="203.0.113.9").status_code == 429


def test_it_locks_an_address_out_that_tries_many_accounts(owner, clock):
    for number in range(20):
        fail(1, email=f"guess{number}@acme.test")

    refused = log_in("owner@acme.test", PASSWORD)
    assert refused.status_code == 429
    assert refused["Retry-After"] == "30"
    assert log_in("owner@acme.test", PASSWORD, address="203.0.113.9").status_code == 302


def test_it_counts_an_ipv6_network_as_one_address(owner, clock):
    for number in range(20):
        fail(1, email=f"guess{number}@acme.test", address=f"2001:db8:1:2::{number + 1:x}")

    assert log_in("owner@acme.test", PASSWORD, address="2001:db8:1:2:ffff::1").status_code == 429
    assert log_in("owner@acme.test", PASSWORD, address="2001:db8:1:3::1").status_code == 302


def test_it_compares_emails_without_regard_to_case(owner, clock):
    for number in range(5):
        fail(1, email="Owner@ACME.test" if number % 2 else "owner@acme.test")

    assert log_in("OWNER@acme.test", PASSWORD).status_code == 429


def test_it_throttles_password_reset_requests_per_email(owner, clock):
    for _ in range(3):
        response = Client(REMOTE_ADDR="198.51.100.7").post("/password-reset/", {"email": "owner@acme.test"})
        assert response.status_code == 302 and response["Location"] == "/password-reset/sent/"
    assert len(mail.outbox) == 3

    refused = Client(REMOTE_ADDR="203.0.113.9").post("/password-reset/", {"email": "OWNER@acme.test"})

    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"
    assert refused.context["form"].non_field_errors() == [
        "Too many password reset requests. Try again in 1 minute."
    ]
    assert len(mail.outbox) == 3
    other = Client(REMOTE_ADDR="203.0.113.9").post("/password-reset/", {"email": "outsider@globex.test"})
    assert other.status_code == 302


def test_it_throttles_password_reset_floods_from_one_address(db, clock):
    for number in range(10):
        response = Client(REMOTE_ADDR="198.51.100.7").post("/password-reset/", {"email": f"n{number}@example.test"})
        assert response.status_code == 302

    refused = Client(REMOTE_ADDR="198.51.100.7").post("/password-reset/", {"email": "n99@example.test"})

    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"
    clock.advance(61)
    assert Client(REMOTE_ADDR="198.51.100.7").post("/password-reset/", {"email": "n99@example.test"}).status_code == 302
    # Another request within the new lockout: it doubled.
    assert Client(REMOTE_ADDR="198.51.100.7").post("/password-reset/", {"email": "x@example.test"})["Retry-After"] == (
        "120"
    )


def sign_up(number: int, address: str = "198.51.100.7"):
    return Client(REMOTE_ADDR=address).post(
        "/signup/",
        {"email": f"person{number}@example.test", "password": PASSWORD, "organization_name": f"Team {number}"},
    )


def test_it_throttles_sign_up_floods_from_one_address(db, clock):
    for number in range(10):
        assert sign_up(number).status_code == 302

    refused = sign_up(10)

    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"
    assert refused.context["form"].non_field_errors() == ["Too many sign-ups from your network. Try again in 1 minute."]
    assert not User.objects.filter(email="person10@example.test").exists()
    assert sign_up(11, address="203.0.113.9").status_code == 302


def test_it_fails_open_when_the_cache_is_unreachable(owner, monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("the cache is down")

    monkeypatch.setattr(lockout.cache, "get_many", unreachable)
    monkeypatch.setattr(lockout.cache, "add", unreachable)

    fail(6)
    assert log_in("owner@acme.test", PASSWORD).status_code == 302


def test_it_throttles_the_admin_sign_in_as_well(db, clock):
    User.objects.create_superuser("root@lab.test", PASSWORD)
    for _ in range(5):
        response = Client(REMOTE_ADDR="198.51.100.7").post(
            "/admin/login/", {"username": "root@lab.test", "password": WRONG}
        )
        assert response.status_code == 200

    refused = Client(REMOTE_ADDR="198.51.100.7").post(
        "/admin/login/", {"username": "root@lab.test", "password": PASSWORD}
    )

    assert refused.status_code == 200
    assert refused.context["form"].non_field_errors() == [
        "Too many failed sign-in attempts. Try again in 30 seconds."
    ]
    assert "_auth_user_id" not in refused.wsgi_request.session
