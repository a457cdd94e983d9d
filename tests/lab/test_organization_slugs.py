"""Organization slugs that name Lab's built-ins are reserved: an organization slugged ``lab``
published ``lab/addition@0.1.0``, which the API answered for ``lab/addition`` while jobs ran the
built-in. A name that would slug to one gets the next free slug; asking for one, creating one
through ``bootstrap_tenant`` or renaming to one in the admin is refused and changes nothing."""

from __future__ import annotations

import pytest

from lab.admin import OrganizationAdminForm
from lab.bootstrap import bootstrap_tenant
from lab.errors import LabError
from lab.models import AuditLogEntry, Organization, User
from lab.services import organization_create, reserved_organization_slugs, user_sign_up

pytestmark = pytest.mark.django_db


def test_the_owners_of_the_built_in_ids_are_reserved():
    assert reserved_organization_slugs() == {"lab", "huggingfacetb"}


@pytest.mark.parametrize(("name", "slug"), [("Lab", "lab-2"), ("LAB", "lab-2"), ("HuggingFaceTB", "huggingfacetb-2"),
                                            ("Lab Partners", "lab-partners")])
def test_a_name_that_slugs_to_a_reserved_slug_gets_the_next_free_one(name, slug):
    user = user_sign_up(email="owner@example.com", password="correct-horse-battery-staple")

    assert organization_create(user=user, name=name).slug == slug


def test_asking_for_a_reserved_slug_is_refused_and_creates_nothing():
    user = user_sign_up(email="owner@example.com", password="correct-horse-battery-staple")

    with pytest.raises(LabError) as refused:
        organization_create(user=user, name="Anything", slug="Lab")

    assert (refused.value.code, refused.value.param, refused.value.message) == (
        "invalid_request",
        "slug",
        "The organization slug 'lab' is reserved: it names Lab's built-in models and environments.",
    )
    assert Organization.objects.count() == 0


def test_bootstrap_tenant_refuses_a_reserved_organization_and_creates_nothing():
    with pytest.raises(LabError) as refused:
        bootstrap_tenant(organization_slug="lab", project_slug="default", email="ops@example.com", password=None)

    assert refused.value.message == (
        "The organization slug 'lab' is reserved: it names Lab's built-in models and environments."
    )
    assert (Organization.objects.count(), User.objects.count(), AuditLogEntry.objects.count()) == (0, 0, 0)


def admin_form(organization: Organization, slug: str) -> OrganizationAdminForm:
    data = {"slug": slug, "name": organization.name, "public_id": organization.public_id,
            "created_at_0": "2026-01-01", "created_at_1": "00:00:00", "created_at": "2026-01-01 00:00:00"}
    return OrganizationAdminForm(data=data, instance=organization)


def test_the_admin_refuses_a_rename_to_a_reserved_slug():
    user = user_sign_up(email="owner@example.com", password="correct-horse-battery-staple")
    organization = organization_create(user=user, name="Acme")

    form = admin_form(organization, "lab")

    assert not form.is_valid()
    assert form.errors["slug"] == ["The organization slug 'lab' is reserved: it names Lab's built-in models and environments."]
    organization.refresh_from_db()
    assert organization.slug == "acme"
    assert admin_form(organization, "acme-labs").is_valid(), admin_form(organization, "acme-labs").errors


def test_the_admin_keeps_an_organization_already_slugged_lab_editable():
    user = user_sign_up(email="owner@example.com", password="correct-horse-battery-staple")
    organization = organization_create(user=user, name="Acme")
    Organization.objects.filter(pk=organization.pk).update(slug="lab")  # slugged before the reservation
    organization.refresh_from_db()

    assert admin_form(organization, "lab").is_valid()
