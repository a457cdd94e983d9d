"""The organization's environments page: the built-ins and its uploaded packages (versions,
pusher, date); owners and admins push a wheel from here (docs/environments.md)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET, require_POST

from dashboard.access import OrganizationAccess, organization_view
from dashboard.views import _render
from environments.services import environment_push
from jobs.api.environments import environment_objects
from lab.api.errors import http_status
from lab.audit import Actor
from lab.errors import LabError


def _page(request: HttpRequest, access: OrganizationAccess, *, pushed=None, error: str = "", status: int = 200) -> HttpResponse:
    context = {
        "environments": environment_objects(access.organization),
        "pushed": pushed,
        "error": error,
    }
    return _render(request, "dashboard/environments.html", context, access=access, status=status)


@require_GET
@organization_view
def environments(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """List the environments every project of the organization may use."""
    return _page(request, access)


@require_POST
@organization_view
def environment_push_view(request: HttpRequest, access: OrganizationAccess) -> HttpResponse:
    """Push the wheel of the form's ``file`` field (owners and admins); the page shows what was
    pushed, or why it was refused with the API's status and message."""
    access.require_manager()
    upload = request.FILES.get("file")
    if upload is None:
        return _page(request, access, error="Choose a wheel file (.whl) to push.", status=400)
    try:
        package, _ = environment_push(
            organization=access.organization,
            actor=Actor(user=request.user),
            handle=upload,
            filename=upload.name or "",
            size_bytes=upload.size,
        )
    except LabError as error:
        return _page(request, access, error=error.message, status=http_status(error))
    return _page(request, access, pushed=package.public_id, status=201)
