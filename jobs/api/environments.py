"""REST endpoints for environments (docs/api.md): one list of the built-ins and the
organization's uploaded packages, pushing a wheel, reading and deleting one version. Thin over
``environments.services`` and ``jobs.environment_packages`` (the in-use check knows jobs)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from engine.catalog import list_environments
from environments.builds import build_again, build_log, latest_build, latest_builds
from environments.serializers import build_to_dict
from environments.services import environment_get, environment_list, environment_push
from jobs.api import openapi
from jobs.environment_packages import environment_delete
from jobs.serializers import environment_package_to_dict, environment_to_dict
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError
from lab.api.pagination import paginate_list
from lab.api.parsers import LabJSONParser
from lab.api.schema import limit_parameter

_UPLOAD_BODY = {
    "multipart/form-data": {
        "type": "object",
        "properties": {"file": {"type": "string", "format": "binary", "description": "the wheel (.whl), at most 100 MB"}},
        "required": ["file"],
    }
}


def environment_objects(organization) -> list[dict]:
    """Return the Environment objects ``GET /environments`` lists: the built-ins, then the
    organization's live packages by name, newest version first, each with the ``args`` its latest
    ready build recorded."""
    builds = latest_builds(organization)
    return [
        *map(environment_to_dict, list_environments().values()),
        *(environment_package_to_dict(package, builds.get(package.public_id)) for package in environment_list(organization=organization)),
    ]


class EnvironmentListView(ProjectAPIView):
    """``GET /environments``: built-ins and the organization's packages; ``POST /environments``: push a wheel."""

    parser_classes = [MultiPartParser, LabJSONParser]

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str, description="id of the last environment seen")],
        responses={200: openapi.ENVIRONMENT_LIST},
    )
    def get(self, request: Request) -> Response:
        return Response(paginate_list(environment_objects(self.project.organization), request.query_params))

    @extend_schema(request=_UPLOAD_BODY, responses={201: openapi.ENVIRONMENT, 200: openapi.ENVIRONMENT})
    def post(self, request: Request) -> Response:
        upload = request.FILES.get("file") if hasattr(request, "FILES") else None
        if upload is None:
            raise ApiError(400, "invalid_request", "Send the wheel as the multipart/form-data field 'file'.", param="file")
        package, created = environment_push(
            organization=self.project.organization,
            actor=self.actor,
            handle=upload,
            filename=upload.name or "",
            size_bytes=upload.size,
        )
        return Response(_with_build(package), status=201 if created else 200)

    # A push is idempotent by its bytes (the same wheel again answers 200 with the same object),
    # so Idempotency-Key's replay, which would hold the whole upload in memory, is not needed.
    post.is_idempotent = True


def _with_build(package) -> dict:
    """The Environment object of an uploaded version with its latest build (``build``)."""
    build = latest_build(package)
    return environment_package_to_dict(package, build) | {"build": build_to_dict(build)}


_VERSION = OpenApiParameter(
    "name", str, OpenApiParameter.PATH, description="<name>, <name>@<version> or <name>@latest (no version: the latest)"
)


def builtin_object(environment_id: str) -> dict | None:
    """Return the built-in ``environment_id`` names (``lab/addition``, ``lab/addition@latest``) as
    ``GET /environments`` lists it, or None: a built-in's owner is a reserved organization slug,
    so no package shares its id."""
    builtin = list_environments().get(environment_id.removesuffix("@latest"))
    return environment_to_dict(builtin) | {"build": None} if builtin is not None else None


def refuse_builtin(environment_id: str, what: str) -> None:
    """Raise the 400 that says ``environment_id`` is a built-in, which ``what`` (``"cannot be
    deleted"``) explains, when it names one; a built-in is no package: it has no build to read or
    run again, and nothing to delete."""
    if builtin_object(environment_id) is not None:
        raise ApiError(
            400, "invalid_request",
            f"{environment_id.removesuffix('@latest')} is one of Lab's built-in environments, part of the engine: it {what}.",
            param="name",
        )


class EnvironmentDetailView(ProjectAPIView):
    """``GET``/``DELETE /environments/{organization}/{name}[@{version}]``: one version of a package,
    or (``GET``) a built-in that the list shows."""

    @extend_schema(parameters=[_VERSION], responses={200: openapi.ENVIRONMENT})
    def get(self, request: Request, organization: str, name: str) -> Response:
        builtin = builtin_object(f"{organization}/{name}")
        if builtin is not None:
            return Response(builtin)
        package = environment_get(organization=self.project.organization, environment_id=f"{organization}/{name}")
        return Response(_with_build(package))

    @extend_schema(parameters=[_VERSION], responses={204: None})
    def delete(self, request: Request, organization: str, name: str) -> Response:
        refuse_builtin(f"{organization}/{name}", "cannot be deleted")
        environment_delete(organization=self.project.organization, actor=self.actor, environment_id=f"{organization}/{name}")
        return Response(status=204)


class EnvironmentBuildLogView(ProjectAPIView):
    """``GET /environments/{organization}/{name}[@{version}]/build-log``: the latest build's log, as text."""

    @extend_schema(parameters=[_VERSION], responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the latest build's log")})
    def get(self, request: Request, organization: str, name: str) -> HttpResponse:
        refuse_builtin(f"{organization}/{name}", "has no build, so no build log")
        package = environment_get(organization=self.project.organization, environment_id=f"{organization}/{name}")
        build = latest_build(package)
        return HttpResponse(build_log(build) if build is not None else "", content_type="text/plain; charset=utf-8")


class EnvironmentBuildsView(ProjectAPIView):
    """``POST /environments/{organization}/{name}[@{version}]/builds``: build the same wheel again,
    resolving against the package index as it is now (a new snapshot)."""

    @extend_schema(parameters=[_VERSION], request=None, responses={201: openapi.ENVIRONMENT_BUILD})
    def post(self, request: Request, organization: str, name: str) -> Response:
        refuse_builtin(f"{organization}/{name}", "has no build to run again")
        package = environment_get(organization=self.project.organization, environment_id=f"{organization}/{name}")
        return Response(build_to_dict(build_again(package)), status=201)
