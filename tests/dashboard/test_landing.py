"""Signing in lands on the jobs of the project this browser last opened (a signed cookie that
outlives the session), unless ``?next=`` says otherwise or the user may no longer open it; without
one, on the project with the user's newest job, or the user's only project."""

from __future__ import annotations

import pytest
from django.test import Client

from dashboard.access import LAST_PROJECT_COOKIE
from jobs.services import job_submit
from lab.audit import Actor
from lab.models import Membership, Project
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def sign_in(client: Client, email: str, next_url: str = "") -> str:
    response = client.post("/login/" + (f"?next={next_url}" if next_url else ""), {"username": email, "password": PASSWORD})
    assert response.status_code == 302, response.content[:500]
    return response["Location"]


def test_signing_in_again_lands_on_the_last_opened_projects_jobs(owner):
    other = Project.objects.create(organization=owner.organization, name="Second", slug="second")
    client = Client()
    assert sign_in(client, owner.user.email) == "/"  # nothing opened yet
    assert client.get(f"/o/acme/p/{other.slug}/").status_code == 200
    client.post("/logout/")

    assert sign_in(client, owner.user.email) == f"/o/acme/p/{other.slug}/"
    assert sign_in(Client(), owner.user.email) == "/"  # another browser has its own


def test_next_wins_over_the_last_project(owner):
    client = Client()
    sign_in(client, owner.user.email)
    client.get("/o/acme/p/default/")
    client.post("/logout/")

    assert sign_in(client, owner.user.email, next_url="/o/acme/webhooks-elsewhere/") == "/o/acme/webhooks-elsewhere/"


def test_a_project_the_user_left_is_not_landed_on(owner, outsider):
    client = Client()
    sign_in(client, owner.user.email)
    client.get("/o/acme/p/default/")
    client.post("/logout/")
    Membership.objects.filter(user=owner.user).delete()

    assert sign_in(client, owner.user.email) == "/"


def test_a_forged_cookie_is_ignored_and_a_real_one_grants_nothing(owner, outsider):
    Project.objects.create(organization=owner.organization, name="Second", slug="second")
    forged = Client()
    forged.cookies[LAST_PROJECT_COOKIE] = "acme/second"  # not signed by Lab
    assert sign_in(forged, owner.user.email) == "/"

    owners = Client()
    sign_in(owners, owner.user.email)
    owners.get("/o/acme/p/default/")
    outsiders = Client()
    outsiders.cookies[LAST_PROJECT_COOKIE] = owners.cookies[LAST_PROJECT_COOKIE].value  # signed, for acme
    assert sign_in(outsiders, outsider.user.email) == "/o/globex/p/default/"  # not a member of acme: their own


def test_a_first_sign_in_lands_on_the_project_with_the_newest_job_or_the_only_project(owner, spec, no_broker):
    assert sign_in(Client(), owner.user.email) == "/o/acme/p/default/"  # the only project

    other = Project.objects.create(organization=owner.organization, name="Second", slug="second")
    assert sign_in(Client(), owner.user.email) == "/"  # two projects, no job: the organization page
    job_submit(project=other, actor=Actor(user=owner.user), data=spec)
    assert sign_in(Client(), owner.user.email) == "/o/acme/p/second/"


def test_pages_link_the_favicon(owner_client):
    page = owner_client.get("/o/acme/p/default/").content.decode()

    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
