"""Dashboard pages for sandboxes (docs/sandboxes.md): the project's list (status, image, CPU and
memory, created, lifetime left, labels, why it failed) and delete.

Thin adapters over ``sandboxes.services``. Every sandbox is looked up *with* the project that
``dashboard.access`` resolved for the signed-in member, so another organization's sandbox is the
same 404 as a missing one. Any member may delete, as a read-write API key of the project may.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from dashboard.access import OrganizationAccess, project_view
from dashboard.views import _actor, _render
from lab.models import Project
from sandboxes.models import ACTIVE_STATUSES, Sandbox, SandboxStatus
from sandboxes.services import sandbox_delete, sandbox_ends_at, sandbox_list

#: Rows shown on the list, newest first.
PAGE_SIZE = 200


def sandbox_row(sandbox: Sandbox, *, now: datetime) -> dict[str, Any]:
    """Return what the list shows of ``sandbox``: ``lifetime_left_s`` (whole seconds, None once it
    is no longer active or past its lifetime)."""
    left = (sandbox_ends_at(sandbox) - now).total_seconds()
    active = sandbox.status in ACTIVE_STATUSES
    return {
        "id": sandbox.public_id, "name": sandbox.name, "status": sandbox.status, "image": sandbox.image,
        "cpu_cores": sandbox.cpu_cores, "memory_gb": sandbox.memory_gb, "created_at": sandbox.created_at,
        "lifetime_left_s": int(left) if active and left > 0 else None, "labels": sorted(sandbox.labels.items()),
        "error": sandbox.error, "active": active,
    }


@require_GET
@project_view
def sandboxes(request: HttpRequest, access: OrganizationAccess, project: Project) -> HttpResponse:
    """The project's sandboxes, newest first (``?status=``)."""
    status = request.GET.get("status") or None
    if status not in (None, *SandboxStatus.values):
        status = None
    found = sandbox_list(project=project).order_by("-id")
    if status:
        found = found.filter(status=status)
    now = timezone.now()
    rows = [sandbox_row(sandbox, now=now) for sandbox in found[:PAGE_SIZE]]
    context = {"project": project, "rows": rows, "status": status, "statuses": SandboxStatus.values}
    return _render(request, "dashboard/sandboxes.html", context, access=access)


@require_POST
@project_view
def sandbox_remove(request: HttpRequest, access: OrganizationAccess, project: Project, sandbox_id: str) -> HttpResponse:
    """Stop a sandbox and delete its files, then show the list again."""
    sandbox = sandbox_list(project=project).select_related("project__organization").filter(public_id=sandbox_id).first()
    if sandbox is None:
        raise Http404("No such sandbox.")
    sandbox_delete(sandbox=sandbox, actor=_actor(request))
    messages.success(request, f"Sandbox {sandbox_id} is stopped and its files are deleted.")
    return redirect("sandboxes", access.organization.slug, project.slug)
