"""Accounts and tenancy: users, organizations, memberships, projects, API keys, audit log.

An Organization owns Projects; a Project owns everything a job produces; an ApiKey belongs to
one Project and is the tenant boundary of the REST API (docs/api.md).
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models
from django.utils import timezone

from lab.ids import public_id


class UserManager(BaseUserManager["User"]):
    """Create users by email; there are no usernames."""

    use_in_migrations = True

    def create_user(self, email: str, password: str | None = None, **fields) -> User:
        """Create and return a user with a normalized email and the given password."""
        if not email:
            raise ValueError("email is required")
        user = self.model(email=self.normalize_email(email).lower(), **fields)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email: str, password: str | None = None, **fields) -> User:
        """Create a staff superuser (for the Django admin)."""
        fields.update(is_staff=True, is_superuser=True)
        return self.create_user(email, password, **fields)


class User(AbstractBaseUser, PermissionsMixin):
    """A person who signs in with an email address and a password."""

    email = models.EmailField(unique=True, max_length=254)
    name = models.CharField(max_length=150, blank=True)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False)
    date_joined = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    def __str__(self) -> str:
        return self.email


def _organization_public_id() -> str:
    return public_id("org")


def _project_public_id() -> str:
    return public_id("proj")


class Organization(models.Model):
    """A team: it has members, projects, a concurrency cap and (later) a billing account."""

    public_id = models.CharField(max_length=40, unique=True, default=_organization_public_id)
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    # Owners and admins may lower the service-wide LAB_ORG_MAX_RUNNING_JOBS; None means the default.
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    """What a member may do: owners and admins manage members, projects and keys."""

    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"


MANAGER_ROLES = (Role.OWNER, Role.ADMIN)


class Membership(models.Model):
    """A user's role in an organization."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "user"], name="membership_unique")]

    @property
    def can_manage(self) -> bool:
        """Whether this member may manage members, projects and API keys."""
        return self.role in MANAGER_ROLES


class Project(models.Model):
    """A project of one organization: jobs, checkpoints and API keys live in it."""

    public_id = models.CharField(max_length=40, unique=True, default=_project_public_id)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="projects")
    slug = models.SlugField(max_length=50)
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "slug"], name="project_slug_unique")]

    def __str__(self) -> str:
        return f"{self.organization.slug}/{self.slug}"


def _api_key_public_id() -> str:
    return public_id("key")


class ApiKeyScope(models.TextChoices):
    """Scopes of an API key: ``read`` reads and estimates; ``write`` also creates and changes;
    ``inference`` calls the project's deployments through the OpenAI-compatible API (which a
    ``write`` key may do too), so a key given to a product can do that and nothing else."""

    READ = "read", "Read"
    WRITE = "write", "Write"
    INFERENCE = "inference", "Inference"


class ApiKeyQuerySet(models.QuerySet):
    """Queries over API keys."""

    def authenticating(self) -> ApiKeyQuerySet:
        """Keep the keys that authenticate now: not revoked, and made by an active user who is still
        an owner or admin of the key's organization (a key acts for its creator; docs/api.md "API
        keys"). A key without a creator (its user was deleted) never authenticates."""
        return self.filter(
            revoked_at__isnull=True,
            created_by__is_active=True,
            created_by__memberships__organization=models.F("project__organization"),
            created_by__memberships__role__in=MANAGER_ROLES,
        )


class ApiKey(models.Model):
    """A project's API key. Only its SHA-256 is stored; the key is shown once, at creation.

    A key reads ``lab_<43 url-safe characters>``; ``prefix`` (its first 12 characters) finds the row
    and the hash is compared in constant time. It acts for ``created_by``, an owner or admin of the
    organization, and authenticates only while they still are (``ApiKeyQuerySet.authenticating``).
    """

    public_id = models.CharField(max_length=40, unique=True, default=_api_key_public_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    @property
    def is_active(self) -> bool:
        """Whether the key is not revoked (it authenticates only while its creator may also make
        keys: ``ApiKeyQuerySet.authenticating``)."""
        return self.revoked_at is None

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"


class Invitation(models.Model):
    """An email invitation to join an organization with a role; the token is stored hashed."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    @property
    def is_pending(self) -> bool:
        """Whether the invitation can still be accepted."""
        return self.accepted_at is None and self.revoked_at is None and self.expires_at > timezone.now()


class AuditLogEntry(models.Model):
    """One state-changing action: who (user or API key), what, on which object, when."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="audit_log")
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_user = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    actor_api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=100, blank=True)
    data = models.JSONField(default=dict)
    request_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class IdempotencyRecord(models.Model):
    """The stored answer to a POST made with an ``Idempotency-Key`` (per project, kept 24 h)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "key"], name="idempotency_key_unique")]
