"""Invitations end to end: invite from the organization page, the email, accepting, withdrawing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from lab.audit import Actor
from lab.models import Invitation, Membership, Role, User
from lab.services import invitation_create, user_sign_up
from tests.conftest import PASSWORD
from tests.support.dashboard import link_in_last_email, signed_in

pytestmark = pytest.mark.django_db


def invite(client: Client, email: str = "grace@example.test", role: str = Role.MEMBER):
    return client.post("/o/acme/invitations/", {"email": email, "role": role})


def test_it_invites_by_email_and_an_existing_user_accepts(owner, owner_client, django_capture_on_commit_callbacks):
    grace = user_sign_up(email="grace@example.test", password=PASSWORD)
    with django_capture_on_commit_callbacks(execute=True):
        response = invite(owner_client, role=Role.ADMIN)
    assert response.status_code == 302 and response["Location"] == "/o/acme/"
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["grace@example.test"]
    assert mail.outbox[0].subject == "You are invited to Acme on Lab"
    page = owner_client.get("/o/acme/")
    assert [invitation.email for invitation in page.context["invitations"]] == ["grace@example.test"]

    link = link_in_last_email(r"http://testserver/invitations/[\w-]+/")
    path = link.removeprefix("http://testserver")
    anonymous = Client().get(path)
    assert anonymous.status_code == 200
    assert b"Create an account" in anonymous.content
    # Accepting needs a signed-in user.
    assert Client().post(path)["Location"] == f"/login/?next={path}"

    grace_client = signed_in(grace)
    assert b"Accept and join" in grace_client.get(path).content
    response = grace_client.post(path)
    assert response.status_code == 302 and response["Location"] == "/o/acme/"
    membership = Membership.objects.get(user=grace)
    assert (membership.organization, membership.role) == (owner.organization, Role.ADMIN)
    assert grace_client.get("/o/acme/").status_code == 200
    # Used: the link now says so and changes nothing.
    used = grace_client.post(path)
    assert used.status_code == 410
    assert used.context["problem"] == "This invitation was already accepted."
    assert Membership.objects.filter(user=grace).count() == 1


def test_it_invites_a_new_person_who_signs_up_from_the_link(owner, owner_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        invite(owner_client, email="new@example.test")
    path = link_in_last_email(r"/invitations/[\w-]+/")
    token = path.split("/")[2]
    page = Client().get(path)
    assert f"/signup/?invitation={token}".encode() in page.content
    client = Client()
    response = client.post("/signup/", {"email": "new@example.test", "password": PASSWORD, "invitation": token})
    assert response.status_code == 302
    user = User.objects.get(email="new@example.test")
    assert Membership.objects.get(user=user).organization == owner.organization
    assert client.get("/")["Location"] == "/o/acme/"


def test_it_refuses_to_accept_for_another_email(owner, outsider):
    _, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="grace@example.test"
    )
    client = signed_in(outsider.user)
    page = client.get(f"/invitations/{token}/")
    assert b"this invitation is for grace@example.test" in page.content
    response = client.post(f"/invitations/{token}/")
    assert response.status_code == 400
    assert response.context["problem"] == "This invitation was sent to another email address."
    assert not Membership.objects.filter(user=outsider.user, organization=owner.organization).exists()


def test_it_explains_an_expired_invitation(owner, owner_client):
    invitation, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="grace@example.test"
    )
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    grace = user_sign_up(email="grace@example.test", password=PASSWORD)
    response = signed_in(grace).post(f"/invitations/{token}/")
    assert response.status_code == 410
    assert response.context["problem"].startswith("This invitation expired on")
    assert not Membership.objects.filter(user=grace).exists()
    # The organization page lists it as expired.
    assert b"expired" in owner_client.get("/o/acme/").content


def test_it_answers_404_with_a_message_for_an_unknown_invitation(db):
    response = Client().get("/invitations/not-a-real-token/")
    assert response.status_code == 404
    assert b"This invitation link is not valid." in response.content


def test_it_revokes_an_invitation(owner, owner_client):
    invitation, token = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="grace@example.test"
    )
    response = owner_client.post(f"/o/acme/invitations/{invitation.pk}/revoke/")
    assert response.status_code == 302
    invitation.refresh_from_db()
    assert invitation.revoked_at is not None
    assert list(owner_client.get("/o/acme/").context["invitations"]) == []
    page = Client().get(f"/invitations/{token}/")
    assert page.status_code == 410
    assert page.context["problem"].startswith("This invitation was withdrawn.")


def test_it_shows_invitation_form_errors(owner, member, owner_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = invite(owner_client, email="member@acme.test")
        assert response.status_code == 200
        assert response.context["invitation_form"].errors == {"email": ["This person is already a member."]}
        response = invite(owner_client, email="not an email")
        assert response.context["invitation_form"].errors == {"email": ["Enter a valid email address."]}
    assert Invitation.objects.count() == 0
    assert mail.outbox == []


def test_it_lets_only_owners_invite_owners(owner, member, owner_client):
    Membership.objects.filter(user=member).update(role=Role.ADMIN)
    admin_client = signed_in(member)
    assert "owner" not in dict(admin_client.get("/o/acme/").context["invitation_form"].fields["role"].choices)
    response = invite(admin_client, role=Role.OWNER)
    assert response.status_code == 200
    assert "role" in response.context["invitation_form"].errors
    assert invite(admin_client, role=Role.ADMIN).status_code == 302
    assert invite(owner_client, email="boss@example.test", role=Role.OWNER).status_code == 302
    assert sorted(Invitation.objects.values_list("email", "role")) == [
        ("boss@example.test", "owner"),
        ("grace@example.test", "admin"),
    ]
