"""The Environments Hub routes that ``prime env`` of ``prime==0.18.0`` calls to push and read an
environment (docs/prime-compat.md "Environments"): thin adapters over ``environments.hub``,
``environments.services`` and ``environments.builds``.

- ``POST /environmentshub/{owner}/{name}/wheels`` → ``{"data": {"wheel_id", "upload_url"}}``; the
  CLI ``PUT``s the wheel to ``upload_url`` (``PUT /environmentshub/uploads/{id}``, authenticated
  by the signed upload id alone, as a presigned URL is), then ``POST .../wheels/{id}/finalize``
  pushes it as ``lab envs push`` does (a new version, its build started).
- ``POST /environmentshub/{owner}/{name}/versions`` and its ``PUT`` and ``finalize``: the source
  archive, checked and not kept.
- ``GET /environmentshub/`` (``prime env list``), ``GET .../{owner}/{name}/status``,
  ``GET .../{owner}/{name}/versions``: the key's organization's packages only; another
  organization's environment is the same 404 as a missing one.

``POST /environmentshub/resolve`` and ``GET .../@{version}`` (``prime env info``) are served with
the evaluations' hub lookups (``evaluations.prime.views``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import JsonResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response

from environments.builds import latest_build, latest_builds
from environments.hub import (
    SOURCE,
    WHEEL,
    hub_source_finalize,
    hub_upload_start,
    hub_upload_store,
    hub_version_find,
    hub_wheel_finalize,
)
from environments.models import EnvironmentPackage
from environments.services import EnvironmentRef, environment_list
from jobs.api.prime.views import PrimeAPIView
from lab.api.errors import ApiError
from lab.errors import LabError
from lab.formats import iso
from lab.paging import int_param

#: Where the hub's features that Lab does not serve are answered, and why.
HUB_UNSUPPORTED = (
    "Lab's Environments Hub serves push, list, info, status and version list only "
    "(pull, install, delete, secrets, variables, inspect and stars are not served); see docs/prime-compat.md."
)


def _hub_name(owner: str, name: str) -> tuple[str, str]:
    """``owner`` and ``name`` of a hub path whose name may carry ``@version`` (the id resolve
    answers for an environment that has versions)."""
    return owner, name.partition("@")[0]


class _HubRoute(PrimeAPIView):
    """A route of the key's organization's environment ``owner/name``: another organization's is
    the 404 a missing one is."""

    def owned_name(self, owner: str, name: str) -> str:
        owner, name = _hub_name(owner, name)
        ref = EnvironmentRef.parse(f"{owner}/{name}")
        if ref is None or ref.organization != self.project.organization.slug:
            raise ApiError(404, "not_found", f"No environment {owner}/{name} on this Lab.")
        return ref.name

    def versions(self, owner: str, name: str) -> list[EnvironmentPackage]:
        """The environment's live versions, newest first; the 404 when it has none."""
        wanted = self.owned_name(owner, name)
        found = [package for package in environment_list(organization=self.project.organization) if package.name == wanted]
        if not found:
            raise ApiError(404, "not_found", f"No environment {owner}/{_hub_name(owner, name)[1]} on this Lab.")
        return found

    def upload_url(self, request: Request, upload_id: str) -> str:
        return request.build_absolute_uri(reverse("prime-hub-upload", kwargs={"upload_id": upload_id}))


def _body(request: Request) -> Mapping[str, Any]:
    return request.data if isinstance(request.data, Mapping) else {}


def _version_to_hub(package: EnvironmentPackage, build_status: str | None) -> dict[str, Any]:
    return {
        "id": package.public_id,
        "version": package.version,
        "semantic_version": package.version,
        "content_hash": package.sha256,
        "sha256": package.sha256,
        "size": 1,  # the CLI prints it as the version's artifact count: one wheel
        "size_bytes": package.size_bytes,
        "created_at": iso(package.created_at),
        "build_status": build_status,
    }


class HubListView(PrimeAPIView):
    """``GET /environmentshub/?limit&offset&search`` (``prime env list``): the organization's
    environments by name, each with its latest version, as ``{"data", "total_count"}``."""

    required_scope = "read"

    def get(self, request: Request) -> Response:
        organization = self.project.organization
        builds = latest_builds(organization)
        latest: dict[str, EnvironmentPackage] = {}
        for package in environment_list(organization=organization):
            latest.setdefault(package.name, package)
        search = request.query_params.get("search", "").lower()
        rows = [package for package in latest.values() if search in package.name or search in package.summary.lower()]
        offset = int_param(request.query_params, "offset", default=0, minimum=0, maximum=1_000_000)
        limit = int_param(request.query_params, "limit", default=20, minimum=1, maximum=100)
        return Response({
            "data": [
                {
                    "id": f"{organization.slug}/{package.name}",
                    "owner": {"name": organization.slug},
                    "name": package.name,
                    "description": package.summary,
                    "visibility": "PRIVATE",
                    "latest_version": package.version,
                    "build_status": build.status if (build := builds.get(package.public_id)) else None,
                    "stars": 0,
                    "updated_at": iso(package.created_at),
                }
                for package in rows[offset:offset + limit]
            ],
            "total_count": len(rows),
        })


class HubStatusView(_HubRoute):
    """``GET /environmentshub/{owner}/{name}/status`` (``prime env status``): the latest version
    and its build."""

    required_scope = "read"

    def get(self, request: Request, owner: str, name: str) -> Response:
        package = self.versions(owner, name)[0]
        build = latest_build(package)
        return Response({"data": {
            "id": package.public_id,
            "name": package.name,
            "owner": {"name": package.organization.slug},
            "description": package.summary,
            "visibility": "PRIVATE",
            "latest_version": _version_to_hub(package, build.status if build else None),
            "build": {"status": build.status, "error": build.error or None} if build else None,
        }})


class HubVersionsView(_HubRoute):
    """``GET /environmentshub/{owner}/{name}/versions`` (``prime env version list``), newest first;
    ``POST`` (the push's source archive): ``{"data": {"version_id", "upload_url"}}`` for the
    version the wheel made."""

    def get(self, request: Request, owner: str, name: str) -> Response:
        packages = self.versions(owner, name)
        builds = latest_builds(self.project.organization)
        return Response({"data": {"versions": [
            _version_to_hub(package, build.status if (build := builds.get(package.public_id)) else None) for package in packages
        ]}})

    def post(self, request: Request, owner: str, name: str) -> Response:
        wanted = self.owned_name(owner, name)
        body = _body(request)
        package = hub_version_find(organization=self.project.organization, name=wanted, version=body.get("semantic_version"))
        upload_id = hub_upload_start(
            organization=self.project.organization, actor=self.actor, kind=SOURCE, name=package.name,
            filename=body.get("filename"), size_bytes=body.get("size"), sha256=body.get("sha256"),
        )
        return Response({"data": {"version_id": upload_id, "upload_url": self.upload_url(request, upload_id), "id": package.public_id}})


class HubVersionFinalizeView(_HubRoute):
    """``POST /environmentshub/{owner}/{name}/versions/{version_id}/finalize``: ``{"data":
    {"success": true, "id", "version"}}`` once the source archive was checked."""

    def post(self, request: Request, owner: str, name: str, version_id: str) -> Response:
        wanted = self.owned_name(owner, name)
        hub_source_finalize(organization=self.project.organization, upload_id=version_id, name=wanted)
        package = self.versions(owner, name)[0]
        return Response({"data": {"success": True, "id": package.public_id, "version": package.version}})


class HubWheelsView(_HubRoute):
    """``POST /environmentshub/{owner}/{name}/wheels`` ``{"filename", "sha256", "size",
    "semantic_version", "content_hash", "metadata"}`` → ``{"data": {"wheel_id", "upload_url"}}``."""

    def post(self, request: Request, owner: str, name: str) -> Response:
        wanted = self.owned_name(owner, name)
        body = _body(request)
        upload_id = hub_upload_start(
            organization=self.project.organization, actor=self.actor, kind=WHEEL, name=wanted,
            filename=body.get("filename"), size_bytes=body.get("size"), sha256=body.get("sha256"),
            version=body.get("semantic_version"),
        )
        return Response({"data": {"wheel_id": upload_id, "upload_url": self.upload_url(request, upload_id)}})


class HubWheelFinalizeView(_HubRoute):
    """``POST /environmentshub/{owner}/{name}/wheels/{wheel_id}/finalize``: the uploaded wheel
    becomes a version (``environment_push``: its build starts); ``{"data": {"success", "id",
    "version", "created", "build_status"}}``."""

    def post(self, request: Request, owner: str, name: str, wheel_id: str) -> Response:
        wanted = self.owned_name(owner, name)
        package, created = hub_wheel_finalize(organization=self.project.organization, actor=self.actor, upload_id=wheel_id, name=wanted)
        build = latest_build(package)
        return Response({"data": {
            "success": True, "id": package.public_id, "version": package.version, "created": created,
            "build_status": build.status if build else None,
        }}, status=201 if created else 200)


class HubUnsupportedView(PrimeAPIView):
    """Every other ``/environmentshub/...`` route: a JSON 404 that says what the hub on Lab serves."""

    required_scope = "read"

    def _not_here(self, request: Request, path: str = "") -> Response:
        raise ApiError(404, "not_found", HUB_UNSUPPORTED)

    get = post = put = patch = delete = _not_here


@method_decorator(csrf_exempt, name="dispatch")
class HubUploadView(View):
    """``PUT /environmentshub/uploads/{upload_id}``: the bytes of one upload, as the hub's
    presigned URL takes them (no API key: the signed id names the organization, the file, its
    size and SHA-256, and expires). Answers ``{"success": true}``, or Prime's ``{"detail"}``."""

    def put(self, request, upload_id: str) -> JsonResponse:
        try:
            ticket = hub_upload_store(upload_id=upload_id, handle=request)
        except LabError as error:
            status = 404 if error.code == "not_found" else 400
            return JsonResponse({"detail": error.message}, status=status)
        return JsonResponse({"success": True, "size": ticket.size_bytes, "sha256": ticket.sha256})

    def http_method_not_allowed(self, request, *args, **kwargs) -> JsonResponse:
        return JsonResponse({"detail": "An upload URL takes one PUT of the file's bytes."}, status=405)


