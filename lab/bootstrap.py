"""Set-up of a tenant from an operator's command line (``manage.py bootstrap_tenant``, docs/api.md
"Set-up"): the user, organization and project, created or reused, and a new API key."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

from lab.audit import Actor, AuditAction, audit_record
from lab.errors import invalid
from lab.models import Membership, Organization, Project, Role, User
from lab.services import (
    api_key_create,
    normalize_email,
    organization_slug_problem,
    project_create,
    validate_new_password,
)


@transaction.atomic
def bootstrap_tenant(*, organization_slug: str, project_slug: str, email: str, password: str | None) -> dict[str, str]:
    """Create or reuse the user, organization (user as owner) and project, and add a new API key.

    Idempotent for the user, organization and project; each call makes one new read-write key,
    created by the user (so it authenticates while they are an owner or admin of the organization).
    Returns ``{"organization", "project", "api_key", "user"}`` (docs/api.md "Set-up").
    Raises ``invalid_request`` for an invalid email, slug or password, or a user who is a plain
    member of an existing organization (nothing is created then).
    """
    try:
        email = normalize_email(email)
    except ValidationError:
        raise invalid(f"invalid email address: {email!r}") from None
    organization_slug, project_slug = organization_slug.strip(), project_slug.strip()
    for label, value in (("organization", organization_slug), ("project", project_slug)):
        if not value or slugify(value) != value or len(value) > 50:
            raise invalid(f"invalid {label} slug {value!r}: use lowercase letters, digits and hyphens")
    user = User.objects.filter(email=email).first()
    if user is None:
        if password:
            validate_new_password(password, user=None)
        user = User.objects.create_user(email=email, password=password or None)
    elif password:
        validate_new_password(password, user=user)
        user.set_password(password)
        user.save(update_fields=["password"])
    organization = Organization.objects.filter(slug=organization_slug).first()
    if organization is None:
        problem = organization_slug_problem(organization_slug)
        if problem:
            raise invalid(problem)
        organization = Organization.objects.create(slug=organization_slug, name=organization_slug)
        audit_record(
            actor=Actor.system(),
            organization=organization,
            action=AuditAction.ORGANIZATION_CREATE,
            target=organization_slug,
        )
    membership, _ = Membership.objects.get_or_create(organization=organization, user=user, defaults={"role": Role.OWNER})
    if not membership.can_manage:
        raise invalid(
            f"{email} is a {membership.role} of {organization_slug}, not an owner or admin: an API key acts "
            "for its creator, who must be one"
        )
    project = Project.objects.filter(organization=organization, slug=project_slug).first()
    if project is None:
        project = project_create(actor=Actor.system(), organization=organization, name=project_slug, slug=project_slug)
    _, plaintext = api_key_create(actor=Actor.system(), project=project, name="bootstrap", created_by=user)
    return {"organization": organization.slug, "project": project.slug, "api_key": plaintext, "user": user.email}
