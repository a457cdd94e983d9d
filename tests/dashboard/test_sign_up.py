"""Sign-up: an account and its organization, or an account joining an invited organization."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from lab.audit import Actor
from lab.models import AuditLogEntry, Invitation, Membership, Organization, Project, Role, User
from lab.services import invitation_create, invitation_revoke

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-and-unusual-passphrase"


def sign_up(client: Client, url: str = "/signup/", **fields):
    data = {"email": "ada@example.test", "password": PASSWORD, "organization_name": "Analytical Engines"}
    data.update(fields)
    return client.post(url, {key: value for key, value in data.items() if value is not None})


def test_it_shows_the_sign_up_form():
    response = Client().get("/signup/")
    assert response.status_code == 200
    assert b'name="organization_name"' in response.content
    assert b"csrfmiddlewaretoken" in response.content


def test_it_signs_up_with_an_organization_and_signs_in():
    client = Client()
    response = sign_up(client)
    user = User.objects.get()
    organization = Organization.objects.get()
    assert user.email == "ada@example.test"
    assert user.check_password(PASSWORD)
    assert (organization.name, organization.slug) == ("Analytical Engines", "analytical-engines")
    assert Membership.objects.get().role == Role.OWNER
    assert list(Project.objects.values_list("slug", flat=True)) == ["default"]
    # Signed in: home sends the user to their only organization.
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/")["Location"] == "/o/analytical-engines/"
    assert client.get("/o/analytical-engines/").status_code == 200


def test_it_refuses_an_existing_email():
    User.objects.create_user(email="ada@example.test", password=PASSWORD)
    response = sign_up(Client(), email="ADA@example.test")
    assert response.status_code == 200
    assert response.context["form"].errors == {"email": ["An account with this email already exists."]}
    assert User.objects.count() == 1
    assert Organization.objects.count() == 0


@pytest.mark.parametrize(
    "password, message",
    [
        ("short1", "This password is too short. It must contain at least 10 characters."),
        ("1234567890123", "This password is entirely numeric."),
        ("password1234", "This password is too common."),
    ],
)
def test_it_refuses_a_weak_password(password, message):
    response = sign_up(Client(), password=password)
    assert response.status_code == 200
    assert message in response.context["form"].errors["password"]
    assert User.objects.count() == 0
    assert Organization.objects.count() == 0


@pytest.mark.parametrize("email", ["not-an-email", "ada@", ""])
def test_it_refuses_an_invalid_email(email):
    response = sign_up(Client(), email=email)
    assert response.status_code == 200
    assert "email" in response.context["form"].errors
    assert User.objects.count() == 0
    assert Organization.objects.count() == 0


def test_it_requires_an_organization_name():
    response = sign_up(Client(), organization_name="")
    assert response.context["form"].errors == {"organization_name": ["This field is required."]}
    assert User.objects.count() == 0


def test_it_creates_nothing_when_the_organization_is_refused():
    # The form accepts the name but the service refuses it (only spaces): the user is rolled back too.
    response = sign_up(Client(), organization_name="   ")
    assert response.status_code == 200
    assert response.context["form"].errors
    assert User.objects.count() == 0
    assert Organization.objects.count() == 0


def test_it_joins_the_invited_organization(owner):
    _, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="ada@example.test", role=Role.ADMIN
    )
    client = Client()
    form_page = client.get(f"/signup/?invitation={token}")
    assert form_page.status_code == 200
    assert b'name="organization_name"' not in form_page.content
    assert form_page.context["form"]["email"].value() == "ada@example.test"

    response = sign_up(client, invitation=token, organization_name=None)
    assert response.status_code == 302
    user = User.objects.get(email="ada@example.test")
    assert Membership.objects.get(user=user).organization == owner.organization
    assert Membership.objects.get(user=user).role == Role.ADMIN
    assert Organization.objects.count() == 1
    assert Invitation.objects.get().accepted_at is not None
    assert client.get("/")["Location"] == f"/o/{owner.organization.slug}/"


def test_it_refuses_an_expired_invitation_with_a_clear_error(owner):
    invitation, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="ada@example.test"
    )
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    users_before = User.objects.count()

    page = Client().get(f"/signup/?invitation={token}")
    assert "This invitation expired on" in page.context["invitation_problem"]

    response = sign_up(Client(), invitation=token, organization_name=None)
    assert response.status_code == 200
    assert response.context["form"].non_field_errors() == ["This invitation has expired or was already used."]
    assert User.objects.count() == users_before
    assert Membership.objects.filter(organization=owner.organization).count() == 1
    assert Invitation.objects.get().accepted_at is None


def test_it_refuses_a_revoked_invitation(owner):
    invitation, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="ada@example.test"
    )
    invitation_revoke(actor=Actor(user=owner.user), invitation=invitation)
    response = sign_up(Client(), invitation=token, organization_name=None)
    assert response.context["form"].non_field_errors() == ["This invitation has expired or was already used."]
    assert not User.objects.filter(email="ada@example.test").exists()


def test_it_refuses_an_unknown_invitation(owner):
    page = Client().get("/signup/?invitation=nope")
    assert page.context["invitation_problem"].startswith("This invitation link is not valid.")
    response = sign_up(Client(), invitation="nope", organization_name=None)
    assert response.context["form"].non_field_errors() == ["This invitation link is not valid."]
    assert not User.objects.filter(email="ada@example.test").exists()


def test_it_refuses_an_invitation_sent_to_another_email(owner):
    _, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="ada@example.test"
    )
    response = sign_up(Client(), email="mallory@example.test", invitation=token, organization_name=None)
    assert response.context["form"].non_field_errors() == ["This invitation was sent to another email address."]
    assert not User.objects.filter(email="mallory@example.test").exists()
    assert Invitation.objects.get().accepted_at is None
    assert not AuditLogEntry.objects.filter(action="invitation.accept").exists()


def test_it_sends_signed_in_users_home(owner_client):
    response = owner_client.get("/signup/")
    assert response.status_code == 302 and response["Location"] == "/"


def test_it_sends_signed_in_invitees_to_the_invitation(owner, outsider_client):
    _, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="ada@example.test"
    )
    assert outsider_client.get(f"/signup/?invitation={token}")["Location"] == f"/invitations/{token}/"
    assert outsider_client.get("/signup/?invitation=a/b")["Location"] == "/"
