"""REST endpoints for sandboxes: the control plane and, for now, the data plane (commands and
files) in front of the runtime (docs/sandboxes.md). Thin over ``sandboxes.services``."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError
from lab.api.pagination import paginate_by_public_id
from lab.api.schema import ERROR, json_body, limit_parameter
from sandboxes import openapi
from sandboxes.models import Sandbox
from sandboxes.serializers import command_result_to_dict, sandbox_to_dict
from sandboxes.services import (
    sandbox_create,
    sandbox_delete,
    sandbox_list,
    sandbox_read_file,
    sandbox_run_command,
    sandbox_write_file,
)

_PATH = OpenApiParameter("path", str, required=True, description="a file in /workspace (relative, or absolute under it)")


class _SandboxView(ProjectAPIView):
    def sandbox(self, sandbox_id: str) -> Sandbox:
        return self.get_owned(Sandbox.objects.select_related("project__organization"), sandbox_id, "sandbox")


def _labels(params) -> dict[str, str]:
    """Return the ``label[key]=value`` query parameters as a dict."""
    return {key[6:-1]: value for key, value in params.items() if key.startswith("label[") and key.endswith("]")}


class SandboxListView(_SandboxView):
    """``GET /sandboxes?label[k]=v`` (newest first); ``POST /sandboxes`` (201, started)."""

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str), OpenApiParameter("label[key]", str, description="only sandboxes with this label value")],
        responses={200: openapi.SANDBOX_LIST},
    )
    def get(self, request: Request) -> Response:
        sandboxes = sandbox_list(project=self.project, labels=_labels(request.query_params))
        return Response(paginate_by_public_id(sandboxes, request.query_params, sandbox_to_dict))

    @extend_schema(request=json_body(openapi.SANDBOX_CREATE), responses={201: openapi.SANDBOX})
    def post(self, request: Request) -> Response:
        sandbox, warnings = sandbox_create(project=self.project, actor=self.actor, data=request.data)
        return Response(sandbox_to_dict(sandbox, warnings=warnings), status=201)


class SandboxDetailView(_SandboxView):
    """``GET`` and ``DELETE /sandboxes/{id}`` (204; the sandbox is ``stopped``, its files gone)."""

    @extend_schema(responses={200: openapi.SANDBOX})
    def get(self, request: Request, sandbox_id: str) -> Response:
        return Response(sandbox_to_dict(self.sandbox(sandbox_id)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, sandbox_id: str) -> Response:
        sandbox_delete(sandbox=self.sandbox(sandbox_id), actor=self.actor)
        return Response(status=204)


class SandboxCommandView(_SandboxView):
    """``POST /sandboxes/{id}/commands``: run a command and answer when it ends."""

    @extend_schema(request=json_body(openapi.COMMAND), responses={200: openapi.COMMAND_RESULT})
    def post(self, request: Request, sandbox_id: str) -> Response:
        result = sandbox_run_command(sandbox=self.sandbox(sandbox_id), data=request.data)
        return Response(command_result_to_dict(result))


class _AnyAccept(DefaultContentNegotiation):
    """A download is the file's bytes whatever ``Accept`` asks for (JSON only for an error)."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class SandboxFileView(_SandboxView):
    """``PUT /sandboxes/{id}/files?path=`` (the body is the file) and ``GET`` (the file's bytes)."""

    content_negotiation_class = _AnyAccept

    @extend_schema(parameters=[_PATH], responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 409: ERROR})
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(sandbox_id)
        data = sandbox_read_file(sandbox=sandbox, path=_path(request))
        return HttpResponse(data, content_type="application/octet-stream")

    @extend_schema(
        parameters=[_PATH],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={200: openapi.FILE_WRITTEN, 409: ERROR},
    )
    def put(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(sandbox_id)
        data = request.body
        written = sandbox_write_file(sandbox=sandbox, path=_path(request), data=data)
        return Response({"path": written, "size_bytes": len(data)})


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if not path:
        raise ApiError(400, "invalid_request", "path is required.", param="path")
    return path
