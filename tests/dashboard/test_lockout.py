"""Throttling of the sign-in, password-change, password-reset and sign-up forms (``lab.lockout``).

After a few failures an account, or a client address, is locked out; each further failure doubles
the lockout. A locked-out attempt is refused with 429, a ``Retry-After`` and a message saying when
to try again, before any password is checked: the right password is refused too. Attempts are
counted before they are checked, so concurrent ones cannot outrun the count, and with the cache
unreachable every attempt is refused (503), none checked.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth import forms as auth_forms
from django.core import mail
from django.db import connection
from django.test import Client

from jobs.processes import free_port
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

    assert response.status_code == 302 and response["Location"] == "/o/acme/p/default/"
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


def test_it_forgets_failures_after_an_hour_without_one(owner, clock, monkeypatch):
    """The counters expire in the cache itself (an hour after their last attempt; a second here)."""
    monkeypatch.setattr(lockout, "MEMORY_S", 1)
    fail(4)
    time.sleep(1.5)
    fail(4)
    assert log_in("owner@acme.test", PASSWORD).status_code == 302


def test_it_leaves_another_account_from_another_address_unaffected(owner, outsider, clock):
    fail(5)
    assert log_in("owner@acme.test", PASSWORD).status_code == 429

    response = log_in("outsider@globex.test", PASSWORD, address="203.0.113.9")

    assert response.status_code == 302 and response["Location"] == "/o/globex/p/default/"


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


def test_successful_sign_ins_do_not_count_against_their_address(owner, clock):
    """Each sign-in is counted before its password is checked; a success takes its count back."""
    for number in range(19):
        fail(1, email=f"guess{number}@acme.test")
    for _ in range(3):
        assert log_in("owner@acme.test", PASSWORD).status_code == 302

    fail(1, email="guess19@acme.test")  # the address's 20th failure locks it out

    refused = log_in("owner@acme.test", PASSWORD)
    assert (refused.status_code, refused["Retry-After"]) == (429, "30")


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


@pytest.fixture
def unreachable_cache(settings):
    """Point the cache at a Redis port nothing listens on (as when Redis is down)."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{free_port()}/0",
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }


UNAVAILABLE = "Lab cannot count attempts right now, so it checks none. Try again in 1 minute."


def test_it_refuses_every_sign_in_while_the_cache_is_unreachable(owner, unreachable_cache):
    response = log_in("owner@acme.test", PASSWORD)

    assert response.status_code == 503
    assert response["Retry-After"] == "60"
    assert response.context["form"].non_field_errors() == [f"Signing in is unavailable for a moment. {UNAVAILABLE}"]
    assert "_auth_user_id" not in response.wsgi_request.session
    admin = Client(REMOTE_ADDR="198.51.100.7").post("/admin/login/", {"username": "owner@acme.test", "password": PASSWORD})
    assert "_auth_user_id" not in admin.wsgi_request.session


def test_it_refuses_password_resets_sign_ups_and_password_changes_while_the_cache_is_unreachable(owner, unreachable_cache):
    reset = Client(REMOTE_ADDR="198.51.100.7").post("/password-reset/", {"email": "owner@acme.test"})
    assert (reset.status_code, reset["Retry-After"]) == (503, "60")
    assert mail.outbox == []

    assert sign_up(1).status_code == 503
    assert not User.objects.filter(email="person1@example.test").exists()

    client = Client(REMOTE_ADDR="198.51.100.7")
    client.force_login(owner.user)
    change = change_password(client, PASSWORD)
    assert (change.status_code, change["Retry-After"]) == (503, "60")
    assert change.context["form"].errors["old_password"] == [f"Changing passwords is unavailable for a moment. {UNAVAILABLE}"]
    assert User.objects.get(pk=owner.user.pk).check_password(PASSWORD)


@pytest.fixture
def slow_password_check(monkeypatch):
    """Make each password check take half a second (as a slow hasher would) and count the checks,
    so that concurrent sign-ins are all in flight at once."""
    checked = []
    real = auth_forms.authenticate

    def authenticate(*args, **kwargs):
        checked.append(kwargs.get("username"))
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(auth_forms, "authenticate", authenticate)
    return checked


def concurrently(count: int, password: str, address: str = "198.51.100.7") -> list[int]:
    """Post ``count`` sign-ins for the owner at once, from threads; return their status codes."""
    start = threading.Barrier(count)
    statuses: list[int] = []

    def one() -> None:
        try:
            start.wait(timeout=30)
            statuses.append(log_in("owner@acme.test", password, address).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return sorted(statuses)


@pytest.mark.django_db(transaction=True)
def test_concurrent_sign_ins_get_no_more_password_checks_than_the_free_attempts(owner, clock, slow_password_check):
    statuses = concurrently(20, WRONG)

    assert len(slow_password_check) == 5
    assert statuses == [200] * 5 + [429] * 15
    assert log_in("owner@acme.test", PASSWORD).status_code == 429


@pytest.mark.django_db(transaction=True)
def test_once_a_lockout_ends_one_concurrent_sign_in_is_checked(owner, clock, slow_password_check):
    fail(5)
    clock.advance(31)
    slow_password_check.clear()

    statuses = concurrently(10, WRONG)

    assert len(slow_password_check) == 1
    assert statuses == [200] + [429] * 9
    refused = log_in("owner@acme.test", PASSWORD)
    assert (refused.status_code, refused["Retry-After"]) == (429, "60")  # the next lockout began with that one


def change_password(client: Client, current: str, new: str = "a-new-long-passphrase-7"):
    return client.post("/password/", {"old_password": current, "new_password1": new, "new_password2": new})


def test_it_throttles_wrong_current_passwords_on_the_password_change_form(owner, clock):
    client = Client(REMOTE_ADDR="198.51.100.7")
    client.force_login(owner.user)
    for _ in range(5):
        wrong = change_password(client, WRONG)
        assert wrong.status_code == 200
        assert wrong.context["form"].errors["old_password"] == [
            "Your old password was entered incorrectly. Please enter it again."
        ]

    refused = change_password(client, PASSWORD)

    assert (refused.status_code, refused["Retry-After"]) == (429, "30")
    assert refused.context["form"].errors["old_password"] == ["Too many wrong current passwords. Try again in 30 seconds."]
    assert User.objects.get(pk=owner.user.pk).check_password(PASSWORD)
    clock.advance(30)
    changed = change_password(client, PASSWORD)
    assert (changed.status_code, changed["Location"]) == (302, "/password/changed/")
    assert User.objects.get(pk=owner.user.pk).check_password("a-new-long-passphrase-7")


def test_a_right_current_password_forgets_the_wrong_ones(owner, clock):
    client = Client(REMOTE_ADDR="198.51.100.7")
    client.force_login(owner.user)
    for _ in range(4):
        change_password(client, WRONG)
    assert change_password(client, PASSWORD, "a-new-long-passphrase-7").status_code == 302
    for _ in range(4):
        assert change_password(client, WRONG).status_code == 200
    assert change_password(client, "a-new-long-passphrase-7", "yet-another-passphrase-9").status_code == 302


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
