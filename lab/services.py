"""Services for accounts and tenancy: every state change goes through one of these functions.

Each runs in one transaction and writes an audit row (``lab.audit.audit_record``). Refusals raise
``lab.errors.LabError``: ``permission_denied`` for an actor who may not do it, ``invalid_request``
for bad input, with the field concerned as ``param``.
"""

from __future__ import annotations

import hmac
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from engine.catalog import builtin_owners
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import FieldError, LabError, invalid, permission_denied
from lab.ids import sha256_hex
from lab.models import (
    ApiKey,
    ApiKeyScope,
    Invitation,
    Membership,
    Organization,
    Project,
    Role,
    User,
)

API_KEY_PREFIX = "lab_"
# last_used_at is written at most this often per key, so reads do not turn into writes.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


# --- users and organizations -----------------------------------------------------------------


def normalize_email(email: str) -> str:
    """Return ``email`` stripped and lower-cased; raise Django's ValidationError if it is not an address."""
    email = (email or "").strip().lower()
    validate_email(email)
    return email


def validate_new_password(password: str, *, user: User | None) -> None:
    """Raise ``invalid_request`` (param ``password``) with every reason Django's validators give."""
    try:
        validate_password(password, user=user)
    except ValidationError as exc:
        problems = [FieldError(param="password", code="invalid", message=message) for message in exc.messages]
        raise LabError("invalid_request", " ".join(exc.messages), errors=problems) from None


def user_sign_up(*, email: str, password: str, name: str = "") -> User:
    """Create a user after validating the email and the password's strength.

    Raises ``invalid_request`` (param ``email`` or ``password``) when either is refused, including an
    email already in use.
    """
    try:
        email = normalize_email(email)
    except ValidationError:
        raise invalid("Enter a valid email address.", param="email") from None
    if User.objects.filter(email=email).exists():
        raise invalid("An account with this email already exists.", param="email")
    validate_new_password(password, user=User(email=email, name=name))
    try:
        with transaction.atomic():
            return User.objects.create_user(email=email, password=password, name=name)
    except IntegrityError:
        raise invalid("An account with this email already exists.", param="email") from None


def _unique_slug(model: type, base: str, *, reserved: frozenset[str] = frozenset(), **scope: Any) -> str:
    base = slugify(base)[:40] or "team"
    slug, suffix = base, 1
    while slug in reserved or model.objects.filter(slug=slug, **scope).exists():
        suffix += 1
        slug = f"{base}-{suffix}"
    return slug


def reserved_organization_slugs() -> frozenset[str]:
    """Return the slugs no organization may take: the owners of the built-in model and
    environment ids (``lab`` of ``lab/addition``). An organization's packages are named
    ``<slug>/<name>``, so an organization slugged ``lab`` would publish ids that jobs read as
    the built-ins (``engine.catalog.builtin_owners``)."""
    return builtin_owners()


def organization_slug_problem(slug: str) -> str | None:
    """Say why ``slug`` cannot be an organization's (it is reserved), or None."""
    if slug in reserved_organization_slugs():
        return f"The organization slug {slug!r} is reserved: it names Lab's built-in models and environments."
    return None


@transaction.atomic
def organization_create(*, user: User, name: str, slug: str | None = None) -> Organization:
    """Create an organization owned by ``user``, with a first project named ``default``.

    Without ``slug`` one is derived from ``name``, skipping taken and reserved ones (``Lab`` is
    ``lab-2``). Raises ``invalid_request`` for an empty name or a reserved ``slug``
    (:func:`reserved_organization_slugs`).
    """
    name = name.strip()[:100]
    if not name:
        raise invalid("An organization needs a name.", param="name")
    if slug:
        slug = slugify(slug)[:50]
        problem = organization_slug_problem(slug)
        if problem:
            raise invalid(problem, param="slug")
    organization = Organization.objects.create(
        name=name, slug=slug or _unique_slug(Organization, name, reserved=reserved_organization_slugs())
    )
    Membership.objects.create(organization=organization, user=user, role=Role.OWNER)
    actor = Actor(user=user)
    audit_record(
        actor=actor, organization=organization, action=AuditAction.ORGANIZATION_CREATE, target=organization.slug
    )
    project_create(actor=actor, organization=organization, name="Default", slug="default")
    return organization


def membership_for(*, user: User, organization: Organization) -> Membership | None:
    """Return ``user``'s membership of ``organization``, or None."""
    if user is None or not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, organization=organization).first()


def _require_manager(actor: Actor, organization: Organization) -> None:
    """Raise ``permission_denied`` unless the actor is an owner/admin (or the system)."""
    if actor.user is None and actor.api_key is None:
        return
    if actor.user is None:
        raise permission_denied("Only organization owners and admins may do this.")
    membership = membership_for(user=actor.user, organization=organization)
    if membership is None or not membership.can_manage:
        raise permission_denied("Only organization owners and admins may do this.")


@transaction.atomic
def project_create(*, actor: Actor, organization: Organization, name: str, slug: str | None = None) -> Project:
    """Create a project in ``organization``. Raises ``permission_denied`` for non-managers."""
    _require_manager(actor, organization)
    name = name.strip()[:100]
    if not name:
        raise invalid("A project needs a name.", param="name")
    slug = slugify(slug)[:50] if slug else _unique_slug(Project, name, organization=organization)
    if Project.objects.filter(organization=organization, slug=slug).exists():
        raise invalid(f"The project {slug!r} already exists.", param="slug")
    project = Project.objects.create(organization=organization, name=name, slug=slug)
    audit_record(
        actor=actor, organization=organization, project=project, action=AuditAction.PROJECT_CREATE, target=slug
    )
    return project


# --- API keys --------------------------------------------------------------------------------


@transaction.atomic
def api_key_create(
    *,
    actor: Actor,
    project: Project,
    name: str,
    scopes: list[str] | None = None,
    created_by: User | None = None,
) -> tuple[ApiKey, str]:
    """Create an API key for ``project`` and return it with its plaintext (shown once, never stored).

    ``scopes`` is ``["read"]``, ``["read", "write"]`` (the default) or ``["inference"]`` (the
    OpenAI-compatible API alone), ``inference`` also beside the others. The key acts for its
    creator, the acting user; the system (``bootstrap_tenant``) names one with ``created_by``.
    The creator must be an owner or admin of the project's organization, and the key authenticates
    only while they still are (``ApiKeyQuerySet.authenticating``; docs/api.md "API keys").
    Raises ``permission_denied`` for non-managers, ``invalid_request`` for unknown scopes, a creator
    missing or other than the acting user, or a creator who is not an owner or admin.
    """
    organization = project.organization
    _require_manager(actor, organization)
    scopes = sorted(set(scopes or [ApiKeyScope.READ, ApiKeyScope.WRITE]))
    if not set(scopes) <= set(ApiKeyScope.values) or (ApiKeyScope.READ not in scopes and scopes != [ApiKeyScope.INFERENCE]):
        raise invalid("Scopes are ['read'], ['read', 'write'] or ['inference'], with 'inference' also beside the others.", param="scopes")
    if actor.user is not None and created_by not in (None, actor.user):
        raise invalid("A user creates API keys for themself only.", param="created_by")
    creator = actor.user or created_by
    if creator is None:
        raise invalid("An API key acts for the owner or admin who creates it: name one.", param="created_by")
    membership = membership_for(user=creator, organization=organization)
    if membership is None or not membership.can_manage:
        raise invalid(f"{creator.email} is not an owner or admin of {organization.slug}; only they create API keys.", param="created_by")
    plaintext = API_KEY_PREFIX + secrets.token_urlsafe(32)
    api_key = ApiKey.objects.create(
        project=project,
        name=(name or "API key").strip()[:100],
        prefix=plaintext[:12],
        key_hash=sha256_hex(plaintext),
        scopes=scopes,
        created_by=creator,
    )
    audit_record(
        actor=actor,
        organization=project.organization,
        project=project,
        action=AuditAction.API_KEY_CREATE,
        target=api_key.public_id,
        data={"name": api_key.name, "scopes": scopes},
    )
    return api_key, plaintext


@transaction.atomic
def api_key_revoke(*, actor: Actor, api_key: ApiKey) -> ApiKey:
    """Revoke ``api_key`` at once; revoking twice is a no-op."""
    organization = api_key.project.organization
    _require_manager(actor, organization)
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor,
            organization=organization,
            project=api_key.project,
            action=AuditAction.API_KEY_REVOKE,
            target=api_key.public_id,
        )
    return api_key


def api_key_authenticate(plaintext: str) -> ApiKey | None:
    """Return the key matching ``plaintext`` (constant-time comparison) when it authenticates, or None.

    A key authenticates while it is not revoked and its creator is an active user who is still
    an owner or admin of the key's organization (``ApiKeyQuerySet.authenticating``): so a key
    stops working when its creator leaves, is removed, loses that role or is deleted or
    deactivated, however that happened. Touches ``last_used_at`` at most once a minute per key
    with a conditional UPDATE.
    """
    if not plaintext.startswith(API_KEY_PREFIX) or not 20 <= len(plaintext) <= 100:
        return None
    digest = sha256_hex(plaintext)
    for candidate in ApiKey.objects.authenticating().select_related("project__organization").filter(
        prefix=plaintext[:12]
    ):
        if hmac.compare_digest(candidate.key_hash, digest):
            now = timezone.now()
            if candidate.last_used_at is None or candidate.last_used_at < now - _LAST_USED_RESOLUTION:
                ApiKey.objects.filter(pk=candidate.pk).update(last_used_at=now)
                candidate.last_used_at = now
            return candidate
    return None


# --- members and invitations -------------------------------------------------------------------


@transaction.atomic
def invitation_create(
    *, actor: Actor, organization: Organization, email: str, role: str = Role.MEMBER, accept_url_base: str | None = None
) -> tuple[Invitation, str]:
    """Invite ``email`` to ``organization`` with ``role`` and email the link; return it and its token.

    Only owners may invite owners. Raises ``permission_denied`` or ``invalid_request``.
    """
    _require_manager(actor, organization)
    try:
        email = normalize_email(email)
    except ValidationError:
        raise invalid("Enter a valid email address.", param="email") from None
    if role not in Role.values:
        raise invalid(f"Role must be one of {', '.join(Role.values)}.", param="role")
    if role == Role.OWNER and actor.user is not None:
        membership = membership_for(user=actor.user, organization=organization)
        if membership is None or membership.role != Role.OWNER:
            raise permission_denied("Only owners may invite owners.")
    if Membership.objects.filter(organization=organization, user__email=email).exists():
        raise invalid("This person is already a member.", param="email")
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        organization=organization,
        email=email,
        role=role,
        token_hash=sha256_hex(token),
        invited_by=actor.user,
        expires_at=timezone.now() + timedelta(seconds=settings.LAB_INVITATION_TTL_S),
    )
    audit_record(
        actor=actor,
        organization=organization,
        action=AuditAction.INVITATION_CREATE,
        target=email,
        data={"role": role},
    )
    link = f"{(accept_url_base or settings.LAB_PUBLIC_URL).rstrip('/')}/invitations/{token}/"
    transaction.on_commit(
        lambda: send_mail(
            subject=f"You are invited to {organization.name} on Lab",
            message=f"Join {organization.name} on Lab as {role}: {link}\nThe link expires in "
            f"{settings.LAB_INVITATION_TTL_S // 86400} days.",
            from_email=None,
            recipient_list=[email],
        )
    )
    return invitation, token


def invitation_by_token(token: str) -> Invitation | None:
    """Return the invitation with this token (pending or not), or None."""
    if not token or len(token) > 100:
        return None
    return Invitation.objects.select_related("organization").filter(token_hash=sha256_hex(token)).first()


@transaction.atomic
def invitation_accept(*, token: str, user: User) -> Membership:
    """Join the invitation's organization as ``user``.

    Raises ``invalid_request`` when the token is unknown, expired, used, revoked or for another email.
    """
    invitation = invitation_by_token(token)
    if invitation is None:
        raise invalid("This invitation link is not valid.")
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if not invitation.is_pending:
        raise invalid("This invitation has expired or was already used.")
    if invitation.email != user.email:
        raise invalid("This invitation was sent to another email address.")
    membership, _ = Membership.objects.get_or_create(
        organization=invitation.organization, user=user, defaults={"role": invitation.role}
    )
    invitation.accepted_at = timezone.now()
    invitation.save(update_fields=["accepted_at"])
    audit_record(
        actor=Actor(user=user),
        organization=invitation.organization,
        action=AuditAction.INVITATION_ACCEPT,
        target=user.email,
        data={"role": membership.role},
    )
    return membership


@transaction.atomic
def invitation_revoke(*, actor: Actor, invitation: Invitation) -> None:
    """Revoke a pending invitation."""
    _require_manager(actor, invitation.organization)
    if invitation.revoked_at is None and invitation.accepted_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor,
            organization=invitation.organization,
            action=AuditAction.INVITATION_REVOKE,
            target=invitation.email,
        )


@transaction.atomic
def membership_set_role(*, actor: Actor, membership: Membership, role: str) -> tuple[Membership, int]:
    """Change a member's role; only owners grant or take away ownership; one owner always stays.

    A member lowered to a role that may not create API keys (below admin) loses the keys they
    created in the organization: return the membership and how many keys were revoked.
    """
    organization = membership.organization
    _require_manager(actor, organization)
    if role not in Role.values:
        raise invalid(f"Role must be one of {', '.join(Role.values)}.", param="role")
    actor_membership = membership_for(user=actor.user, organization=organization) if actor.user else None
    touches_owner = Role.OWNER in (role, membership.role)
    if touches_owner and actor_membership is not None and actor_membership.role != Role.OWNER:
        raise permission_denied("Only owners may grant or take away ownership.")
    _keep_one_owner(membership, new_role=role)
    old_role, membership.role = membership.role, role
    membership.save(update_fields=["role"])
    revoked = 0
    if not membership.can_manage:
        revoked = _revoke_api_keys_created_by(
            actor=actor, organization=organization, user=membership.user, reason=AuditAction.MEMBERSHIP_SET_ROLE
        )
    data: dict[str, Any] = {"from": old_role, "to": role}
    if revoked:
        data["revoked_api_keys"] = revoked
    audit_record(
        actor=actor,
        organization=organization,
        action=AuditAction.MEMBERSHIP_SET_ROLE,
        target=membership.user.email,
        data=data,
    )
    return membership, revoked


@transaction.atomic
def membership_remove(*, actor: Actor, membership: Membership) -> int:
    """Remove a member (a member may also leave by themself); the last owner cannot leave.

    The API keys the member created in the organization are revoked with them, so access does
    not outlive the membership: return how many were.
    """
    organization = membership.organization
    if actor.user is None or actor.user.pk != membership.user_id:
        _require_manager(actor, organization)
        actor_membership = membership_for(user=actor.user, organization=organization) if actor.user else None
        if membership.role == Role.OWNER and actor_membership is not None and actor_membership.role != Role.OWNER:
            raise permission_denied("Only owners may remove an owner.")
    _keep_one_owner(membership, new_role=None)
    email = membership.user.email
    revoked = _revoke_api_keys_created_by(
        actor=actor, organization=organization, user=membership.user, reason=AuditAction.MEMBERSHIP_REMOVE
    )
    membership.delete()
    audit_record(
        actor=actor,
        organization=organization,
        action=AuditAction.MEMBERSHIP_REMOVE,
        target=email,
        data={"revoked_api_keys": revoked} if revoked else None,
    )
    return revoked


def _revoke_api_keys_created_by(
    *, actor: Actor, organization: Organization, user: User, reason: AuditAction
) -> int:
    """Revoke the active keys ``user`` created in ``organization``'s projects, one audit row each
    (``reason`` names the membership change); return how many. Call inside that change's transaction."""
    now = timezone.now()
    api_keys = list(
        ApiKey.objects.select_for_update(of=("self",))
        .select_related("project")
        .filter(project__organization=organization, created_by=user, revoked_at__isnull=True)
        .order_by("id")
    )
    ApiKey.objects.filter(pk__in=[api_key.pk for api_key in api_keys]).update(revoked_at=now)
    for api_key in api_keys:
        audit_record(
            actor=actor,
            organization=organization,
            project=api_key.project,
            action=AuditAction.API_KEY_REVOKE,
            target=api_key.public_id,
            data={"reason": reason, "created_by": user.email},
        )
    return len(api_keys)


def _keep_one_owner(membership: Membership, *, new_role: str | None) -> None:
    if membership.role != Role.OWNER or new_role == Role.OWNER:
        return
    owners = Membership.objects.select_for_update().filter(organization=membership.organization, role=Role.OWNER)
    if owners.exclude(pk=membership.pk).count() == 0:
        raise invalid("An organization keeps at least one owner.")
