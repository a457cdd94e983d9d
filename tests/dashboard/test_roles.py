"""Roles and tenancy on every organization, project and key page.

Owners and admins manage; a member sees the pages but gets 403 on every managing POST; anyone
outside the organization gets the same 404 as for a missing one. Refused requests change nothing.
"""

from __future__ import annotations

import functools
import re

import pytest
from django.core import mail

from lab.audit import Actor
from lab.models import ApiKey, AuditLogEntry, Invitation, Membership, Project, Role
from lab.services import api_key_create, invitation_create, user_sign_up
from tests.conftest import PASSWORD
from tests.support.dashboard import signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme(owner, member):
    """Acme with a second member, a pending invitation and a second API key; returns the URLs."""
    colleague = user_sign_up(email="colleague@acme.test", password=PASSWORD)
    colleague_membership = Membership.objects.create(organization=owner.organization, user=colleague, role=Role.MEMBER)
    invitation, _ = invitation_create(
        actor=Actor(user=owner.user), organization=owner.organization, email="x@example.test"
    )
    api_key, _ = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ci")
    owner_membership = Membership.objects.get(user=owner.user)
    return {
        "pages": [
            "/o/acme/",
            "/o/acme/p/default/",
            "/o/acme/p/default/keys/",
            f"/o/acme/p/default/keys/{api_key.public_id}/revoke/",
        ],
        "managing_posts": [
            ("/o/acme/projects/", {"name": "Secret"}),
            ("/o/acme/invitations/", {"email": "new@example.test", "role": "member"}),
            (f"/o/acme/invitations/{invitation.pk}/revoke/", {}),
            (f"/o/acme/members/{colleague_membership.pk}/role/", {"role": "admin"}),
            (f"/o/acme/members/{owner_membership.pk}/role/", {"role": "member"}),
            (f"/o/acme/members/{colleague_membership.pk}/remove/", {}),
            (f"/o/acme/members/{owner_membership.pk}/remove/", {}),
            ("/o/acme/p/default/keys/", {"name": "mine", "access": "read_write"}),
            (f"/o/acme/p/default/keys/{api_key.public_id}/revoke/", {}),
        ],
    }


def snapshot() -> dict:
    """Everything a dashboard POST could change."""
    return {
        "projects": sorted(Project.objects.values_list("organization__slug", "slug")),
        "memberships": sorted(Membership.objects.values_list("organization__slug", "user__email", "role")),
        "invitations": sorted(Invitation.objects.values_list("email", "role", "revoked_at", "accepted_at")),
        "keys": sorted(ApiKey.objects.values_list("public_id", "revoked_at")),
        "audit": AuditLogEntry.objects.count(),
        "mail": len(mail.outbox),
    }


def test_it_lets_a_member_see_the_pages_without_managing_forms(acme, member_client):
    for page in acme["pages"][:3]:
        assert member_client.get(page).status_code == 200, page
    organization_page = member_client.get("/o/acme/").content.decode()
    assert 'action="/o/acme/projects/"' not in organization_page
    assert 'action="/o/acme/invitations/"' not in organization_page
    assert "/role/" not in organization_page
    assert "Revoke" not in organization_page
    keys_page = member_client.get("/o/acme/p/default/keys/")
    assert keys_page.context["form"] is None
    assert [key.name for key in keys_page.context["keys"]] == ["ci", "test"]
    assert "/revoke/" not in keys_page.content.decode()


def test_it_refuses_managing_posts_from_a_member_with_403(acme, member_client):
    before = snapshot()
    for url, data in acme["managing_posts"]:
        response = member_client.post(url, data)
        assert response.status_code == 403, url
        assert b"Only organization owners and admins may do this." in response.content
    assert member_client.get(acme["pages"][3]).status_code == 403
    assert snapshot() == before


def test_it_answers_404_to_an_outsider_on_every_page_and_post(acme, outsider_client):
    before = snapshot()
    for page in acme["pages"] + ["/o/acme/audit/"]:
        assert outsider_client.get(page).status_code == 404, page
    for url, data in acme["managing_posts"]:
        assert outsider_client.post(url, data).status_code == 404, url
    assert snapshot() == before


def test_it_answers_the_same_404_for_a_missing_organization_and_a_foreign_one(acme, outsider_client):
    foreign = outsider_client.get("/o/acme/")
    missing = outsider_client.get("/o/no-such-org/")
    assert foreign.status_code == missing.status_code == 404
    # The pages differ only in the masked CSRF token of the top bar's logout form.
    unmask = functools.partial(re.sub, rb'name="csrfmiddlewaretoken" value="[^"]+"', b"")
    assert unmask(foreign.content) == unmask(missing.content)


def test_it_answers_404_for_another_organizations_objects_through_ones_own_org(acme, owner, outsider):
    """Ids of Acme's members, invitations and keys under Globex's URLs are 404 for Globex's owner."""
    client = signed_in(outsider.user)
    before = snapshot()
    for url, data in acme["managing_posts"]:
        if "/members/" in url or "/invitations/" in url and "revoke" in url or "keys/key_" in url:
            assert client.post(url.replace("/o/acme/", "/o/globex/"), data).status_code == 404, url
    assert client.get(acme["pages"][3].replace("/o/acme/", "/o/globex/")).status_code == 404
    assert snapshot() == before


def test_it_lets_the_owner_create_a_project(owner, owner_client):
    response = owner_client.post("/o/acme/projects/", {"name": "Reverse Text"})
    assert response.status_code == 302 and response["Location"] == "/o/acme/p/reverse-text/"
    page = owner_client.get("/o/acme/p/reverse-text/")
    assert page.status_code == 200
    assert b"<h2>Jobs</h2>" in page.content
    assert b"/o/acme/p/reverse-text/keys/" in page.content
    assert Project.objects.filter(organization=owner.organization, slug="reverse-text").exists()


def test_it_shows_project_form_errors(owner, owner_client):
    response = owner_client.post("/o/acme/projects/", {"name": "Other", "slug": "default"})
    assert response.status_code == 200
    assert response.context["project_form"].errors == {"slug": ["The project 'default' already exists."]}
    assert Project.objects.filter(organization=owner.organization).count() == 1


def test_it_lets_an_admin_manage_members_but_not_owners(owner, member, acme):
    Membership.objects.filter(user=member).update(role=Role.ADMIN)
    client = signed_in(member)
    colleague = Membership.objects.get(user__email="colleague@acme.test")
    owner_membership = Membership.objects.get(user=owner.user)
    assert client.post(f"/o/acme/members/{colleague.pk}/role/", {"role": "admin"}).status_code == 302
    assert Membership.objects.get(pk=colleague.pk).role == Role.ADMIN
    assert client.post(f"/o/acme/members/{owner_membership.pk}/role/", {"role": "member"}).status_code == 403
    assert client.post(f"/o/acme/members/{owner_membership.pk}/remove/").status_code == 403
    assert Membership.objects.get(pk=owner_membership.pk).role == Role.OWNER
    assert client.post(f"/o/acme/members/{colleague.pk}/remove/").status_code == 302
    assert not Membership.objects.filter(pk=colleague.pk).exists()


def test_it_lets_the_owner_change_roles_and_keeps_one_owner(owner, member, owner_client):
    membership = Membership.objects.get(user=member)
    assert owner_client.post(f"/o/acme/members/{membership.pk}/role/", {"role": "owner"}).status_code == 302
    assert Membership.objects.get(pk=membership.pk).role == Role.OWNER
    own = Membership.objects.get(user=owner.user)
    assert owner_client.post(f"/o/acme/members/{own.pk}/role/", {"role": "member"}).status_code == 302
    assert Membership.objects.get(pk=own.pk).role == Role.MEMBER
    # Now the former member is the only owner: they cannot step down.
    new_owner = signed_in(member)
    response = new_owner.post(f"/o/acme/members/{membership.pk}/role/", {"role": "member"}, follow=True)
    assert "An organization keeps at least one owner." in [str(message) for message in response.context["messages"]]
    assert Membership.objects.get(pk=membership.pk).role == Role.OWNER


def test_it_lets_a_member_leave(member, member_client):
    membership = Membership.objects.get(user=member)
    response = member_client.post(f"/o/acme/members/{membership.pk}/remove/")
    assert response.status_code == 302 and response["Location"] == "/"
    assert not Membership.objects.filter(user=member).exists()
    assert member_client.get("/o/acme/").status_code == 404
    home = member_client.get("/")
    assert home.status_code == 200
    assert home.context["memberships"] == []
    assert b'action="/organizations/new/"' in home.content


def test_it_lists_projects_members_and_invitations(acme, owner_client):
    page = owner_client.get("/o/acme/")
    assert [project.slug for project in page.context["projects"]] == ["default"]
    assert [(m.user.email, m.role, manageable) for m, manageable in page.context["members"]] == [
        ("owner@acme.test", "owner", False),
        ("member@acme.test", "member", True),
        ("colleague@acme.test", "member", True),
    ]
    assert [invitation.email for invitation in page.context["invitations"]] == ["x@example.test"]


def test_it_lists_the_users_organizations_on_home(owner, outsider):
    Membership.objects.create(organization=outsider.organization, user=owner.user, role=Role.MEMBER)
    page = signed_in(owner.user).get("/")
    assert page.status_code == 200
    assert [m.organization.slug for m in page.context["memberships"]] == ["acme", "globex"]
    assert [m.organization.slug for m in page.context["nav_memberships"]] == ["acme", "globex"]


def test_it_creates_another_organization(owner, owner_client):
    response = owner_client.post("/organizations/new/", {"name": "Initech"})
    assert response.status_code == 302 and response["Location"] == "/o/initech/"
    assert Membership.objects.get(user=owner.user, organization__slug="initech").role == Role.OWNER


def flashed(response) -> list[str]:
    """The messages shown on a page reached by following a redirect."""
    return [str(message) for message in response.context["messages"]]


def test_it_says_how_many_keys_a_removed_member_loses(owner, member, owner_client):
    membership = Membership.objects.get(user=member)
    Membership.objects.filter(pk=membership.pk).update(role=Role.ADMIN)
    for name in ("ci", "laptop"):
        api_key_create(actor=Actor(user=member), project=owner.project, name=name)

    response = owner_client.post(f"/o/acme/members/{membership.pk}/remove/", follow=True)

    assert response.redirect_chain == [("/o/acme/", 302)]
    assert flashed(response) == ["Removed member@acme.test; 2 API keys they created were revoked."]
    assert "Removed member@acme.test; 2 API keys they created were revoked." in response.content.decode()
    assert sorted(ApiKey.objects.filter(revoked_at__isnull=True).values_list("name", flat=True)) == ["test"]


def test_it_says_nothing_about_keys_when_a_removed_member_had_none(owner, member, owner_client):
    membership = Membership.objects.get(user=member)
    response = owner_client.post(f"/o/acme/members/{membership.pk}/remove/", follow=True)
    assert flashed(response) == ["Removed member@acme.test."]


def test_it_says_how_many_keys_a_demoted_admin_loses(owner, member, owner_client):
    membership = Membership.objects.get(user=member)
    Membership.objects.filter(pk=membership.pk).update(role=Role.ADMIN)
    api_key_create(actor=Actor(user=member), project=owner.project, name="ci")

    response = owner_client.post(f"/o/acme/members/{membership.pk}/role/", {"role": "member"}, follow=True)

    assert flashed(response) == ["member@acme.test is now member; 1 API key they created was revoked."]
    assert ApiKey.objects.get(name="ci").revoked_at is not None


def test_it_says_how_many_keys_a_leaving_admin_loses(owner, member, member_client):
    membership = Membership.objects.get(user=member)
    Membership.objects.filter(pk=membership.pk).update(role=Role.ADMIN)
    api_key_create(actor=Actor(user=member), project=owner.project, name="ci")

    response = member_client.post(f"/o/acme/members/{membership.pk}/remove/", follow=True)

    assert flashed(response) == ["You left Acme; 1 API key you created was revoked."]
