"""Resolve the organization or project named in a dashboard URL *together with* the user's membership.

Every tenant-owned dashboard page goes through :func:`organization_view` or :func:`project_view`.
The lookup is a single query joined on the signed-in user's membership, so an organization the user
does not belong to is the same 404 as one that does not exist (STYLE.md practice 2): nothing is
fetched first and checked afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404

from jobs.models import Job
from lab.errors import LabError
from lab.models import Membership, Organization, Project, Role, User


@dataclass(frozen=True)
class OrganizationAccess:
    """An organization as seen by one of its members."""

    membership: Membership

    @property
    def organization(self) -> Organization:
        """The organization the membership belongs to."""
        return self.membership.organization

    @property
    def can_manage(self) -> bool:
        """Whether the user may manage members, projects and API keys (owners and admins)."""
        return self.membership.can_manage

    @property
    def is_owner(self) -> bool:
        """Whether the user owns the organization."""
        return self.membership.role == Role.OWNER

    def can_manage_member(self, membership: Membership) -> bool:
        """Whether the dashboard offers to change or remove ``membership`` (never one's own; only
        owners touch owners). The services enforce the same rules."""
        if not self.can_manage or membership.pk == self.membership.pk:
            return False
        return self.is_owner or membership.role != Role.OWNER

    def require_manager(self) -> None:
        """Raise PermissionDenied (403) unless the user is an owner or admin."""
        if not self.can_manage:
            raise PermissionDenied("Only organization owners and admins may do this.")

    def require_owner(self) -> None:
        """Raise PermissionDenied (403) unless the user is an owner."""
        if not self.is_owner:
            raise PermissionDenied("Only organization owners may see this.")


def organization_access(*, user: User, organization_slug: str) -> OrganizationAccess:
    """Return ``user``'s access to the organization ``organization_slug``.

    Raises Http404 when the organization does not exist or ``user`` is not a member of it.
    """
    membership = (
        Membership.objects.select_related("organization")
        .filter(user=user, organization__slug=organization_slug)
        .first()
    )
    if membership is None:
        raise Http404("No such organization.")
    return OrganizationAccess(membership=membership)


def project_in(access: OrganizationAccess, project_slug: str) -> Project:
    """Return the project ``project_slug`` of the accessed organization; Http404 when there is none."""
    project = Project.objects.filter(organization=access.organization, slug=project_slug).first()
    if project is None:
        raise Http404("No such project.")
    project.organization = access.organization
    return project


def organization_view(view):
    """Decorate a view taking ``(request, access, **kwargs)`` routed with ``<org_slug>``.

    Anonymous users are sent to the login page; non-members get a 404.
    """

    @login_required
    @wraps(view)
    def wrapper(request, org_slug: str, **kwargs):
        access = organization_access(user=request.user, organization_slug=org_slug)
        return view(request, access, **kwargs)

    return wrapper


def project_view(view):
    """Decorate a view taking ``(request, access, project, **kwargs)`` routed with ``<org_slug>``
    and ``<project_slug>``. Anonymous users are sent to the login page; non-members get a 404."""

    @login_required
    @wraps(view)
    def wrapper(request, org_slug: str, project_slug: str, **kwargs):
        access = organization_access(user=request.user, organization_slug=org_slug)
        project = project_in(access, project_slug)
        response = view(request, access, project, **kwargs)
        remember_project(request, response, access.organization.slug, project.slug)
        return response

    return wrapper


#: The signed cookie naming the project this browser last opened (``<org slug>/<project slug>``),
#: where signing in lands next time. A cookie rather than the session: signing out ends the session.
LAST_PROJECT_COOKIE = "lab_last_project"
LAST_PROJECT_MAX_AGE_S = 365 * 24 * 3600


def remember_project(request, response, org_slug: str, project_slug: str) -> None:
    """Set the last-project cookie on ``response`` when it names another project than the
    request's (signed, so a visitor cannot make it name one; it grants nothing by itself)."""
    value = f"{org_slug}/{project_slug}"
    if request.get_signed_cookie(LAST_PROJECT_COOKIE, default=None, salt=LAST_PROJECT_COOKIE) != value:
        response.set_signed_cookie(
            LAST_PROJECT_COOKIE, value, salt=LAST_PROJECT_COOKIE, max_age=LAST_PROJECT_MAX_AGE_S,
            httponly=True, samesite="Lax", secure=settings.SESSION_COOKIE_SECURE,
        )


def landing_project(request) -> tuple[str, str] | None:
    """Return the ``(org_slug, project_slug)`` whose jobs signing in lands on: the project this
    browser last opened if the signed-in user may still open it (a member of its organization);
    else (the first sign-in, another browser) the user's project with the newest job, or the
    user's only project; else None (the home page, which goes on to the organization page)."""
    value = request.get_signed_cookie(LAST_PROJECT_COOKIE, default=None, salt=LAST_PROJECT_COOKIE)
    org_slug, slash, project_slug = (value or "").partition("/")
    if slash and Project.objects.filter(
        organization__slug=org_slug, slug=project_slug, organization__memberships__user=request.user
    ).exists():
        return org_slug, project_slug
    newest = (
        Job.objects.for_member(request.user).order_by("-id")
        .values_list("project__organization__slug", "project__slug").first()
    )
    if newest is not None:
        return newest
    projects = list(
        Project.objects.filter(organization__memberships__user=request.user).values_list("organization__slug", "slug")[:2]
    )
    return projects[0] if len(projects) == 1 else None


def refusal_message(error: LabError) -> str:
    """Return the message a page shows for a service's refusal; a ``permission_denied`` one raises
    ``PermissionDenied`` instead, which Django answers with the 403 page."""
    if error.code == "permission_denied":
        raise PermissionDenied(error.message)
    return error.message
