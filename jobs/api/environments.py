"""REST endpoints for environments (docs/api.md): one list of the built-ins and the
organization's uploaded packages, pushing a wheel, reading and deleting one version. Thin over
``environments.services`` and ``jobs.environment_packages`` (the in-use check knows jobs)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from engine.catalog import list_environments
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from environments.services import environment_get, environment_list, environment_push
from jobs.api import openapi
from jobs.environment_packages import environment_delete
from jobs.serializers import environment_package_to_dict, environment_to_dict
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError
from lab.api.pagination import paginate_list
from lab.api.schema import limit_parameter
from lab.api.parsers import LabJSONParser

_UPLOAD_BODY = {
    "multipart/form-data": {
        "type": "object",
        "properties": {"file": {"type": "string", "format": "binary", "description": "the wheel (.whl), at most 100 MB"}},
        "required": ["file"],
    }
}


def environment_objects(organization) -> list[dict]:
    """Return the Environment objects ``GET /environments`` lists: the built-ins, then the
    organization's live packages by name, newest version first."""
    return [
        *map(environment_to_dict, list_environments().values()),
        *map(environment_package_to_dict, environment_list(organization=organization)),
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
        return Response(environment_package_to_dict(package), status=201 if created else 200)

    # A push is idempotent by its bytes (the same wheel again answers 200 with the same object),
    # so Idempotency-Key's replay, which would hold the whole upload in memory, is not needed.
    post.is_idempotent = True


_VERSION = OpenApiParameter(
    "name", str, OpenApiParameter.PATH, description="<name>, <name>@<version> or <name>@latest (no version: the latest)"
)


class EnvironmentDetailView(ProjectAPIView):
    """``GET``/``DELETE /environments/{organization}/{name}[@{version}]``: one version of a package."""

    @extend_schema(parameters=[_VERSION], responses={200: openapi.ENVIRONMENT})
    def get(self, request: Request, organization: str, name: str) -> Response:
        package = environment_get(organization=self.project.organization, environment_id=f"{organization}/{name}")
        return Response(environment_package_to_dict(package))

    @extend_schema(parameters=[_VERSION], responses={204: None})
    def delete(self, request: Request, organization: str, name: str) -> Response:
        environment_delete(organization=self.project.organization, actor=self.actor, environment_id=f"{organization}/{name}")
        return Response(status=204)
