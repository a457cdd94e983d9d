"""CSRF protection on dashboard forms."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from lab.models import Project

pytestmark = pytest.mark.django_db


def test_it_refuses_a_post_without_the_csrf_token(owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner.user)
    response = client.post("/o/acme/projects/", {"name": "Forged"})
    assert response.status_code == 403
    assert not Project.objects.filter(name="Forged").exists()

    page = client.get("/o/acme/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    response = client.post("/o/acme/projects/", {"name": "Real", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Project.objects.filter(organization=owner.organization, name="Real").exists()


def test_it_refuses_a_sign_up_without_the_csrf_token(db):
    client = Client(enforce_csrf_checks=True)
    response = client.post(
        "/signup/", {"email": "ada@example.test", "password": "a-long-and-unusual-passphrase", "organization_name": "X"}
    )
    assert response.status_code == 403
    assert not Project.objects.exists()
