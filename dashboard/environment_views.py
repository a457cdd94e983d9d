"""The organization's environments page: the built-ins and its uploaded packages (versions, the
arguments each takes, pusher, date, the latest build's status with a link to its log); owners and
admins push a wheel from here (docs/environments.md). One environment's page lists its versions
and the evaluations the organization's projects ran on each, best first (docs/evaluations.md)."""

from __future__ import annotations

import json
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dashboard.access import OrganizationAccess, organization_view
from dashboard.evaluation_presenter import version_rows
from dashboard.views import _render
from environments.builds import build_log, latest_build, latest_builds
from environments.models import BuildStatus, EnvironmentBuild, EnvironmentPackage
from environments.services import environment_get, environment_push
from evaluations.selectors import environment_evaluations
from jobs.api.environments import environment_objects
from lab.api.errors import http_status
from lab.audit import Actor
from lab.errors import LabError


def _default_text(value: Any) -> str:
    """A recorded default as the page shows it: JSON, or the repr the build recorded for a value JSON cannot hold."""
    if isinstance(value, dict) and set(value) == {"repr"}:
        return str(value["repr"])
    return json.dumps(value)


def _arguments(environment: dict, build: EnvironmentBuild | None) -> list[str]:
    """``name=default`` per argument a version takes (``name (required)`` for one without a
    default): a built-in's from the catalogue, a package's as its latest ready build recorded them."""
    if environment["kind"] == "builtin":
        return [f"{name}={_default_text(value)}" for name, value in environment["args"].items()]
    if build is None or build.status != BuildStatus.READY:
        return []
    return [
        f"{parameter['name']} (required)" if parameter.get("required") else f"{parameter['name']}={_default_text(parameter['default'])}"
        for parameter in build.summary.get("parameters") or []
    ]


def _pusher(package: EnvironmentPackage) -> str:
    """Who pushed ``package``: the user's email, or the API key's name and who created it."""
    if package.pushed_by is not None:
        return package.pushed_by.email
    key = package.pushed_by_key
    if key is None:
        return ""
    return f"{key.name} (API key of {key.created_by.email})" if key.created_by is not None else f"{key.name} (API key)"


def _page(request: HttpRequest, access: OrganizationAccess, *, pushed=None, error: str = "", status: int = 200) -> HttpResponse:
    builds = latest_builds(access.organization)
    packages = {
        package.public_id: package
        for package in EnvironmentPackage.objects.for_organization(access.organization).filter(deleted_at=None)
        .select_related("organization", "pushed_by", "pushed_by_key__created_by")
    }
    rows = []
    for environment in environment_objects(access.organization):
        build = builds.get(environment["id"])
        log_url = None
        if build is not None:
            version = environment["id"].partition("/")[2]
            log_url = reverse("environment_build_log", kwargs={"org_slug": access.organization.slug, "environment": version})
        package = packages.get(environment["id"])
        owner, _, name = environment["id"].partition("@")[0].partition("/")
        rows.append({
            **environment, "build": build, "build_log_url": log_url, "arguments": _arguments(environment, build),
            "pushed_by": _pusher(package) if package is not None else "",
            "page_url": reverse("environment", kwargs={"org_slug": access.organization.slug, "owner": owner, "name": name}),
        })
    context = {
        "environments": rows,
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


@require_GET
@organization_view
def environment_build_log(request: HttpRequest, access: OrganizationAccess, environment: str) -> HttpResponse:
    """The latest build's log of the package version ``environment`` (``<name>@<version>``), as
    text (empty while the build has not run); 404 for a package the organization does not have."""
    try:
        package = environment_get(organization=access.organization, environment_id=f"{access.organization.slug}/{environment}")
    except LabError:
        raise Http404("No such environment.") from None
    build = latest_build(package)
    return HttpResponse(build_log(build) if build is not None else "", content_type="text/plain; charset=utf-8")


@require_GET
@organization_view
def environment_detail(request: HttpRequest, access: OrganizationAccess, owner: str, name: str) -> HttpResponse:
    """The page of the environment ``<owner>/<name>`` (a built-in, or one of the organization's
    packages): its versions, and per version the evaluations of the organization's projects that
    ran it, best first (reward mean on it, highest first; those not ended after). 404 for an
    environment the organization neither may use nor has evaluated, as for another's."""
    environment = f"{owner}/{name}"
    versions = [
        item for item in environment_objects(access.organization)
        if item["id"] == environment or item["id"].startswith(f"{environment}@")
    ]
    groups = environment_evaluations(organization=access.organization, environment=environment)
    if not versions and not groups:
        raise Http404("No such environment.")
    context = {
        "environment": environment,
        "versions": versions,
        "groups": [(group.environment_id, version_rows(group)) for group in groups],
    }
    return _render(request, "dashboard/environment.html", context, access=access)
