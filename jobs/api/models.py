"""REST endpoints of the model registry (docs/models.md, docs/api.md "Models"): the models an
organization sees, pushing its own, one model with its latest check, and that check's log. Thin
over ``jobs.registry``: a push only stores the archive; a worker checks it."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.api import openapi
from jobs.registry.builds import build_log
from jobs.registry.selectors import latest_builds, model_get, model_list
from jobs.registry.services import latest_build, model_push
from jobs.serializers import model_to_dict
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError
from lab.api.pagination import list_envelope
from lab.api.parsers import LabJSONParser

_PUSH_BODY = {
    "multipart/form-data": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "the model's id: <organization slug>/<name>"},
            "file": {"type": "string", "format": "binary", "description": "a tar (or .tar.gz) of a Hugging Face model directory"},
        },
        "required": ["name", "file"],
    }
}


class ModelListView(ProjectAPIView):
    """``GET /models``: the registry's models offered to everyone and the organization's own;
    ``POST /models``: push an archive of a model directory as one of the organization's models."""

    parser_classes = [MultiPartParser, LabJSONParser]

    @extend_schema(responses={200: openapi.MODEL_LIST})
    def get(self, request: Request) -> Response:
        organization = self.project.organization
        builds = latest_builds(organization)
        models = [model_to_dict(model, builds.get(model.id)) for model in model_list(organization).values()]
        return Response(list_envelope(models, has_more=False))

    @extend_schema(request=_PUSH_BODY, responses={201: openapi.MODEL, 200: openapi.MODEL})
    def post(self, request: Request) -> Response:
        upload = request.FILES.get("file") if hasattr(request, "FILES") else None
        if upload is None:
            raise ApiError(400, "invalid_request", "Send the model archive as the multipart/form-data field 'file'.", param="file")
        name = request.data.get("name") if hasattr(request.data, "get") else None
        if not isinstance(name, str) or not name:
            raise ApiError(400, "invalid_request", "Name the model: the form field 'name', <organization slug>/<name>.", param="name")
        build, created = model_push(
            organization=self.project.organization, actor=self.actor, model_id=name, handle=upload, size_bytes=upload.size,
        )
        return Response(model_to_dict(build.model, build), status=201 if created else 200)

    # A push is idempotent by its bytes (the same archive again answers 200 with the same check),
    # so Idempotency-Key's replay, which would hold the upload in memory, is not needed.
    post.is_idempotent = True


class ModelDetailView(ProjectAPIView):
    """``GET /models/{owner}/{name}``: one model the organization sees, with its latest check."""

    @extend_schema(responses={200: openapi.MODEL})
    def get(self, request: Request, owner: str, name: str) -> Response:
        model = model_get(organization=self.project.organization, model_id=f"{owner}/{name}")
        return Response(model_to_dict(model, latest_build(model) if model.organization_id else None))


class ModelBuildLogView(ProjectAPIView):
    """``GET /models/{owner}/{name}/build-log``: the log of a pushed model's latest check, as
    text ("" for a model that was never pushed)."""

    @extend_schema(responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="the latest check's log")})
    def get(self, request: Request, owner: str, name: str) -> HttpResponse:
        model = model_get(organization=self.project.organization, model_id=f"{owner}/{name}")
        build = latest_build(model) if model.organization_id else None
        return HttpResponse(build_log(build) if build is not None else "", content_type="text/plain; charset=utf-8")
