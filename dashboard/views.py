"""Dashboard views: thin adapters from HTTP to the services in ``lab.services``.

Tenant-owned pages resolve their organization and project through ``dashboard.access`` (a
non-member gets the same 404 as a missing slug). Pages that change something accept POST only, and
refuse members who may not manage with 403 before reading the form; the services check again.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render, resolve_url
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.access import OrganizationAccess, landing_project, organization_view, project_view, refusal_message
from dashboard.forms import (
    ApiKeyCreateForm,
    InvitationCreateForm,
    MembershipRoleForm,
    OrganizationCreateForm,
    ProjectCreateForm,
    SignUpForm,
    ThrottledPasswordChangeForm,
    add_service_errors,
)
from lab import lockout, services
from lab.api.errors import lab_error_body, not_found
from lab.audit import Actor
from lab.errors import LabError
from lab.models import ApiKey, Invitation, Membership, Project, Role

AUDIT_LOG_PAGE_SIZE = 50


def _render(
    request: HttpRequest,
    template: str,
    context: dict | None = None,
    *,
    access: OrganizationAccess | None = None,
    status: int = 200,
) -> HttpResponse:
    """Render ``template`` with what the top bar needs: the user's organizations and the current
    organization's projects."""
    page = {"access": access, "current_organization": access.organization if access else None}
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        page["nav_memberships"] = (
            Membership.objects.filter(user=user).select_related("organization").order_by("organization__name")
        )
    if access is not None:
        page["nav_projects"] = access.organization.projects.order_by("name")
    page.update(context or {})
    return render(request, template, page, status=status)


def _actor(request: HttpRequest) -> Actor:
    return Actor(user=request.user)


# --- accounts ------------------------------------------------------------------------------------


def _invitation_problem(invitation: Invitation | None) -> str:
    """Say why ``invitation`` cannot be accepted (empty when it can)."""
    if invitation is None:
        return "This invitation link is not valid. Check the link in your email, or ask for a new invitation."
    if invitation.accepted_at is not None:
        return "This invitation was already accepted."
    if invitation.revoked_at is not None:
        return "This invitation was withdrawn. Ask an owner or admin of the organization for a new one."
    if not invitation.is_pending:
        return (
            f"This invitation expired on {invitation.expires_at:%Y-%m-%d %H:%M} UTC. "
            "Ask an owner or admin of the organization for a new one."
        )
    return ""


def _locked_out(response: HttpResponse, refusal: lockout.Refused) -> HttpResponse:
    """Turn the page that shows ``refusal`` into its status (429 locked out, 503 when attempts
    cannot be counted) with ``Retry-After``."""
    response.status_code = refusal.status
    response["Retry-After"] = str(refusal.retry_after_s)
    return response


class LoginView(auth_views.LoginView):
    """Django's login view over :class:`EmailAuthenticationForm`; a refused sign-in (the form
    refuses it before checking the password: locked out, or the lockout's cache unreachable)
    answers 429 or 503 with ``Retry-After``."""

    def form_invalid(self, form):
        response = super().form_invalid(form)
        return _locked_out(response, form.locked_out) if form.locked_out else response

    def get_default_redirect_url(self):
        """Land on the jobs of the user's last project (``landing_project``); else the home page
        (``LOGIN_REDIRECT_URL``), which goes on to the organization page. A ``?next=`` still wins."""
        landing = landing_project(self.request)
        if landing:
            return resolve_url("project", org_slug=landing[0], project_slug=landing[1])
        return super().get_default_redirect_url()


class PasswordChangeView(auth_views.PasswordChangeView):
    """Django's password change over :class:`ThrottledPasswordChangeForm`: wrong current passwords
    are throttled like sign-ins, and a refused attempt answers 429 or 503 with ``Retry-After``."""

    form_class = ThrottledPasswordChangeForm

    def get_form_kwargs(self):
        return {**super().get_form_kwargs(), "request": self.request}

    def form_invalid(self, form):
        response = super().form_invalid(form)
        return _locked_out(response, form.locked_out) if form.locked_out else response


class PasswordResetView(auth_views.PasswordResetView):
    """Django's password-reset request, throttled per email and per client address (``lab.lockout``):
    a flood of reset emails to one person, or from one address, answers 429 and sends nothing."""

    def form_valid(self, form):
        try:
            lockout.attempt(
                lockout.PASSWORD_RESET,
                email=form.cleaned_data["email"],
                address=lockout.client_address(self.request),
            )
        except lockout.Refused as refusal:
            form.add_error(None, refusal.message)
            return _locked_out(self.form_invalid(form), refusal)
        return super().form_valid(form)


@require_http_methods(["GET", "POST"])
def sign_up(request: HttpRequest) -> HttpResponse:
    """Create an account and an organization, or join the organization of ``?invitation=<token>``.

    Sign-ups are throttled per client address (``lab.lockout``): past the limit the page answers 429.
    """
    source = request.POST if request.method == "POST" else request.GET
    token = (source.get("invitation") or "").strip()
    invitation = services.invitation_by_token(token) if token else None
    if request.user.is_authenticated:
        return redirect("invitation", token=token) if invitation else redirect("home")
    form = SignUpForm(
        request.POST if request.method == "POST" else None,
        invitation_token=token,
        initial={"email": invitation.email} if invitation else None,
    )
    refusal = None
    if request.method == "POST" and form.is_valid():
        try:
            lockout.attempt(lockout.SIGN_UP, address=lockout.client_address(request))
            user = form.save()
        except lockout.Refused as locked_out:
            refusal = locked_out
            form.add_error(None, refusal.message)
        except LabError as error:
            form.add_service_errors(error)
        else:
            login(request, user)
            return redirect("home")
    context = {
        "form": form,
        "invitation": invitation,
        "invitation_problem": _invitation_problem(invitation) if token else "",
    }
    response = _render(request, "accounts/signup.html", context)
    return _locked_out(response, refusal) if refusal else response


@require_http_methods(["GET", "POST"])
def invitation_detail(request: HttpRequest, token: str) -> HttpResponse:
    """Show an invitation and accept it for the signed-in user (POST).

    Unknown tokens answer 404, expired, used or withdrawn ones 410, with a message saying which.
    """
    invitation = services.invitation_by_token(token)
    problem = _invitation_problem(invitation)
    status = 404 if invitation is None else 410 if problem else 200
    if request.method == "POST" and not problem:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        try:
            membership = services.invitation_accept(token=token, user=request.user)
        except LabError as error:
            problem, status = error.message, 400
        else:
            messages.success(request, f"You joined {membership.organization.name} as {membership.role}.")
            return redirect("organization", org_slug=membership.organization.slug)
    context = {"invitation": invitation, "problem": problem, "token": token}
    return _render(request, "accounts/invitation.html", context, status=status)


# --- organizations -------------------------------------------------------------------------------


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """List the user's organizations; go straight to the only one."""
    memberships = list(
        Membership.objects.filter(user=request.user).select_related("organization").order_by("organization__name")
    )
    if len(memberships) == 1:
        return redirect("organization", org_slug=memberships[0].organization.slug)
    return _render(request, "dashboard/home.html", {"memberships": memberships, "form": OrganizationCreateForm()})


@login_required
@require_http_methods(["GET", "POST"])
def organization_create(request: HttpRequest) -> HttpResponse:
    """Create an organization owned by the signed-in user."""
    form = OrganizationCreateForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            organization = services.organization_create(user=request.user, name=form.cleaned_data["name"])
        except LabError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Created {organization.name}.")
            return redirect("organization", org_slug=organization.slug)
    return _render(request, "dashboard/organization_create.html", {"form": form})


def _organization_page(
    request: HttpRequest,
    access: OrganizationAccess,
    *,
    project_form: ProjectCreateForm | None = None,
    invitation_form: InvitationCreateForm | None = None,
) -> HttpResponse:
    organization = access.organization
    invitations = organization.invitations.filter(accepted_at__isnull=True, revoked_at__isnull=True).order_by(
        "-created_at"
    )
    context = {
        "organization": organization,
        "projects": organization.projects.order_by("name"),
        "members": [
            (membership, access.can_manage_member(membership))
            for membership in organization.memberships.select_related("user").order_by("created_at", "id")
        ],
        "invitations": invitations,
        "project_form": project_form or ProjectCreateForm(),
        "invitation_form": invitation_form or InvitationCreateForm(include_owner=access.is_owner),
        "role_choices": [(value, label) for value, label in Role.choices if access.is_owner or value != Role.OWNER],
    }
    return _render(request, "dashboard/organization.html", context, access=access)


@require_GET
@organization_view
def organization_detail(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """The organization page: projects, members with roles, pending invitations, and (for owners
    and admins) the forms that manage them."""
    return _organization_page(request, access)


@require_POST
@organization_view
def project_create(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """Create a project (owners and admins)."""
    access.require_manager()
    form = ProjectCreateForm(request.POST)
    if form.is_valid():
        try:
            project = services.project_create(
                actor=_actor(request),
                organization=access.organization,
                name=form.cleaned_data["name"],
                slug=form.cleaned_data["slug"] or None,
            )
        except LabError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Created project {project.name}.")
            return redirect("project", org_slug=access.organization.slug, project_slug=project.slug)
    return _organization_page(request, access, project_form=form)


@require_POST
@organization_view
def invitation_create(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """Invite someone by email with a role (owners and admins); the service sends the email."""
    access.require_manager()
    form = InvitationCreateForm(request.POST, include_owner=access.is_owner)
    if form.is_valid():
        try:
            invitation, _ = services.invitation_create(
                actor=_actor(request),
                organization=access.organization,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                accept_url_base=request.build_absolute_uri("/"),
            )
        except LabError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Invited {invitation.email} as {invitation.role}.")
            return redirect("organization", org_slug=access.organization.slug)
    return _organization_page(request, access, invitation_form=form)


@require_POST
@organization_view
def invitation_revoke(request: HttpRequest, access: OrganizationAccess, invitation_id: int) -> HttpResponse:
    """Withdraw a pending invitation (owners and admins)."""
    access.require_manager()
    invitation = get_object_or_404(Invitation, organization=access.organization, pk=invitation_id)
    services.invitation_revoke(actor=_actor(request), invitation=invitation)
    messages.success(request, f"Withdrew the invitation to {invitation.email}.")
    return redirect("organization", org_slug=access.organization.slug)


def _revoked_keys(count: int, *, whose: str = "they") -> str:
    """Say how many API keys a membership change revoked ("; 2 API keys they created were
    revoked"), or nothing when it revoked none."""
    if not count:
        return ""
    if count == 1:
        return f"; 1 API key {whose} created was revoked"
    return f"; {count} API keys {whose} created were revoked"


@require_POST
@organization_view
def membership_role(request: HttpRequest, access: OrganizationAccess, membership_id: int) -> HttpResponse:
    """Change a member's role (owners and admins; only owners touch ownership)."""
    access.require_manager()
    membership = get_object_or_404(
        Membership.objects.select_related("user", "organization"), organization=access.organization, pk=membership_id
    )
    form = MembershipRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a role: owner, admin or member.")
    else:
        try:
            _, revoked = services.membership_set_role(
                actor=_actor(request), membership=membership, role=form.cleaned_data["role"]
            )
        except LabError as error:
            messages.error(request, refusal_message(error))
        else:
            messages.success(request, f"{membership.user.email} is now {membership.role}{_revoked_keys(revoked)}.")
    return redirect("organization", org_slug=access.organization.slug)


@require_POST
@organization_view
def membership_remove(request: HttpRequest, access: OrganizationAccess, membership_id: int) -> HttpResponse:
    """Remove a member (owners and admins), or leave the organization (one's own membership)."""
    membership = get_object_or_404(
        Membership.objects.select_related("user", "organization"), organization=access.organization, pk=membership_id
    )
    leaving = membership.pk == access.membership.pk
    if not leaving:
        access.require_manager()
    try:
        revoked = services.membership_remove(actor=_actor(request), membership=membership)
    except LabError as error:
        messages.error(request, refusal_message(error))
        return redirect("organization", org_slug=access.organization.slug)
    if leaving:
        messages.success(request, f"You left {access.organization.name}{_revoked_keys(revoked, whose='you')}.")
        return redirect("home")
    messages.success(request, f"Removed {membership.user.email}{_revoked_keys(revoked)}.")
    return redirect("organization", org_slug=access.organization.slug)


@require_GET
@organization_view
def audit_log(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """The organization's audit log, newest first (owners only)."""
    access.require_owner()
    entries = access.organization.audit_log.select_related("actor_user", "actor_api_key", "project")
    page = Paginator(entries, AUDIT_LOG_PAGE_SIZE).get_page(request.GET.get("page"))
    return _render(request, "dashboard/audit_log.html", {"page": page}, access=access)


# --- projects and API keys -----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@project_view
def api_keys(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """List the project's API keys; POST creates one (owners and admins) and shows its secret once.

    A key that is not revoked but whose creator is no longer an owner or admin of the organization
    (so it does not authenticate) is listed as inactive.

    The secret is in the POST's response only (never stored, never in a redirect), so reloading the
    page shows the list without it.
    """
    form = ApiKeyCreateForm() if access.can_manage else None
    created = None
    if request.method == "POST":
        access.require_manager()
        form = ApiKeyCreateForm(request.POST)
        if form.is_valid():
            try:
                api_key, plaintext = services.api_key_create(
                    actor=_actor(request), project=project, name=form.cleaned_data["name"], scopes=form.scopes
                )
            except LabError as error:
                add_service_errors(form, error, {"scopes": "access"})
            else:
                created = {"api_key": api_key, "plaintext": plaintext}
                form = ApiKeyCreateForm()
    context = {
        "project": project,
        "keys": project.api_keys.select_related("created_by").order_by("-created_at", "-id"),
        # Keys not revoked whose creator is no longer an owner or admin here do not authenticate.
        "authenticating": set(project.api_keys.authenticating().values_list("pk", flat=True)),
        "form": form,
        "created": created,
    }
    response = _render(request, "dashboard/api_keys.html", context, access=access)
    if created:
        response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@project_view
def api_key_revoke(request: HttpRequest, access: OrganizationAccess, project: Project, key_id: str) -> HttpResponse:
    """Ask to confirm (GET), then revoke (POST) one of the project's API keys (owners and admins)."""
    access.require_manager()
    api_key = get_object_or_404(ApiKey, project=project, public_id=key_id)
    if request.method == "POST":
        services.api_key_revoke(actor=_actor(request), api_key=api_key)
        messages.success(request, f"Revoked the key {api_key.name} ({api_key.prefix}…).")
        return redirect("api_keys", org_slug=access.organization.slug, project_slug=project.slug)
    return _render(request, "dashboard/api_key_revoke.html", {"project": project, "api_key": api_key}, access=access)


# --- errors --------------------------------------------------------------------------------------


def not_found_page(request: HttpRequest, exception=None) -> HttpResponse:
    """404 for pages; the API error body for /api/ paths."""
    if request.path.startswith("/api/"):
        return JsonResponse(lab_error_body(not_found()), status=404)
    return _render(request, "404.html", status=404)
