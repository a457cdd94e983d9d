"""Login, logout and password reset (Django's views with Lab's templates)."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from tests.conftest import PASSWORD
from tests.support.dashboard import link_in_last_email

pytestmark = pytest.mark.django_db


def test_it_shows_the_login_form():
    response = Client().get("/login/")
    assert response.status_code == 200
    assert b'type="email"' in response.content


def test_it_logs_in_with_email_and_password(owner):
    client = Client()
    response = client.post("/login/", {"username": "OWNER@acme.test", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/o/acme/p/default/"  # the only project's jobs
    assert client.get("/o/acme/").status_code == 200


def test_it_refuses_a_wrong_password(owner):
    client = Client()
    response = client.post("/login/", {"username": "owner@acme.test", "password": "wrong-password-here"})
    assert response.status_code == 200
    assert response.context["form"].non_field_errors()
    assert client.get("/o/acme/")["Location"] == "/login/?next=/o/acme/"


def test_it_sends_anonymous_visitors_to_login(owner):
    for path in ["/", "/o/acme/", "/o/acme/p/default/", "/o/acme/p/default/keys/", "/o/acme/audit/"]:
        response = Client().get(path)
        assert response.status_code == 302, path
        assert response["Location"] == f"/login/?next={path}"


def test_it_comes_back_to_next_after_login(owner):
    response = Client().post(
        "/login/", {"username": "owner@acme.test", "password": PASSWORD, "next": "/o/acme/p/default/keys/"}
    )
    assert response["Location"] == "/o/acme/p/default/keys/"


def test_it_logs_out_on_post_only(owner_client):
    assert owner_client.get("/logout/").status_code == 405
    assert owner_client.get("/o/acme/").status_code == 200
    response = owner_client.post("/logout/")
    assert response.status_code == 302 and response["Location"] == "/login/"
    assert owner_client.get("/o/acme/").status_code == 302


def test_it_emails_a_working_password_reset_link(owner):
    client = Client()
    assert client.get("/password-reset/").status_code == 200
    response = client.post("/password-reset/", {"email": "owner@acme.test"})
    assert response.status_code == 302 and response["Location"] == "/password-reset/sent/"
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["owner@acme.test"]
    assert mail.outbox[0].subject == "Reset your Lab password"

    link = link_in_last_email(r"/password-reset/[^/\s]+/[^/\s]+/")
    form_page = client.get(link, follow=True)
    assert form_page.status_code == 200
    assert form_page.context["validlink"] is True
    set_password_url = form_page.redirect_chain[-1][0]
    new_password = "a-brand-new-passphrase"
    response = client.post(set_password_url, {"new_password1": new_password, "new_password2": new_password})
    assert response.status_code == 302 and response["Location"] == "/password-reset/complete/"

    owner.user.refresh_from_db()
    assert owner.user.check_password("a-brand-new-passphrase")
    assert Client().login(email="owner@acme.test", password="a-brand-new-passphrase")
    # The link works once.
    assert Client().get(link, follow=True).context["validlink"] is False


def test_it_sends_no_reset_email_for_an_unknown_address(db):
    response = Client().post("/password-reset/", {"email": "nobody@example.test"})
    assert response.status_code == 302 and response["Location"] == "/password-reset/sent/"
    assert mail.outbox == []


def test_it_changes_the_password_of_a_signed_in_user(owner, owner_client):
    assert owner_client.get("/password/").status_code == 200
    refused = owner_client.post(
        "/password/", {"old_password": "wrong", "new_password1": "another-passphrase", "new_password2": "x"}
    )
    assert set(refused.context["form"].errors) == {"old_password", "new_password2"}
    response = owner_client.post(
        "/password/",
        {"old_password": PASSWORD, "new_password1": "another-passphrase", "new_password2": "another-passphrase"},
    )
    assert response.status_code == 302 and response["Location"] == "/password/changed/"
    owner.user.refresh_from_db()
    assert owner.user.check_password("another-passphrase")
    assert owner_client.get("/o/acme/").status_code == 200  # still signed in
    assert Client().get("/password/")["Location"] == "/login/?next=/password/"
