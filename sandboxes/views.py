"""REST endpoints of the sandboxes' control plane (docs/sandboxes.md); commands and files go to the
sandbox agent's data plane with the token ``/auth`` (or the create answer) gives. Thin over
``sandboxes.services``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from lab.api.base import ProjectAPIView
from lab.api.pagination import paginate_by_public_id
from lab.api.schema import ERROR, json_body, limit_parameter
from sandboxes import openapi
from sandboxes.logs import sandbox_logs
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.serializers import access_to_dict, bulk_delete_to_dict, logs_to_dict, sandbox_to_dict
from sandboxes.services import (
    parse_sandbox_bulk_delete,
    sandbox_access,
    sandbox_bulk_delete,
    sandbox_create,
    sandbox_delete,
    sandbox_list,
)


class _SandboxView(ProjectAPIView):
    def sandbox(self, sandbox_id: str) -> Sandbox:
        return self.get_owned(Sandbox.objects.select_related("project__organization"), sandbox_id, "sandbox")


def _labels(params) -> dict[str, str]:
    """Return the ``label[key]=value`` query parameters as a dict."""
    return {key[6:-1]: value for key, value in params.items() if key.startswith("label[") and key.endswith("]")}


class SandboxListView(_SandboxView):
    """``GET /sandboxes?label[k]=v`` (newest first); ``POST /sandboxes`` (201, started, with its
    ``data_plane`` access; 503 ``sandbox_capacity`` when the Kubernetes pool has no warm pod)."""

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str), OpenApiParameter("label[key]", str, description="only sandboxes with this label value")],
        responses={200: openapi.SANDBOX_LIST},
    )
    def get(self, request: Request) -> Response:
        sandboxes = sandbox_list(project=self.project, labels=_labels(request.query_params))
        return Response(paginate_by_public_id(sandboxes, request.query_params, sandbox_to_dict))

    @extend_schema(request=json_body(openapi.SANDBOX_CREATE), responses={201: openapi.SANDBOX, 503: ERROR})
    def post(self, request: Request) -> Response:
        sandbox, warnings = sandbox_create(project=self.project, actor=self.actor, data=request.data)
        access = sandbox_access(sandbox=sandbox) if sandbox.status == SandboxStatus.RUNNING else None
        return Response(sandbox_to_dict(sandbox, warnings=warnings, access=access), status=201)


class SandboxBulkDeleteView(_SandboxView):
    """``POST /sandboxes/bulk-delete``: stop the project's sandboxes named by ``ids`` and its active
    ones with every label of ``labels``; ids it has not (another organization's too) come back
    under ``not_found``, untouched."""

    @extend_schema(request=json_body(openapi.SANDBOX_BULK_DELETE), responses={200: openapi.SANDBOX_BULK_DELETE_RESULT})
    def post(self, request: Request) -> Response:
        parsed = parse_sandbox_bulk_delete(request.data)
        deleted, not_found = sandbox_bulk_delete(
            project=self.project, actor=self.actor, sandbox_ids=parsed.sandbox_ids, labels=parsed.labels
        )
        return Response(bulk_delete_to_dict(deleted, not_found))


class SandboxDetailView(_SandboxView):
    """``GET`` and ``DELETE /sandboxes/{id}`` (204; the sandbox is ``stopped``, its files gone)."""

    @extend_schema(responses={200: openapi.SANDBOX})
    def get(self, request: Request, sandbox_id: str) -> Response:
        return Response(sandbox_to_dict(self.sandbox(sandbox_id)))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, sandbox_id: str) -> Response:
        sandbox_delete(sandbox=self.sandbox(sandbox_id), actor=self.actor)
        return Response(status=204)


class SandboxAuthView(_SandboxView):
    """``POST /sandboxes/{id}/auth``: the data plane's address and a token for this sandbox alone."""

    @extend_schema(request=None, responses={200: openapi.DATA_PLANE, 409: ERROR})
    def post(self, request: Request, sandbox_id: str) -> Response:
        return Response(access_to_dict(sandbox_access(sandbox=self.sandbox(sandbox_id))))


class SandboxLogsView(_SandboxView):
    """``GET /sandboxes/{id}/logs``: what its commands printed, an ended sandbox's as Lab kept it
    (409 when none was kept). A key needs ``write``, as for the data plane the output comes from."""

    required_scope = "write"

    @extend_schema(responses={200: openapi.SANDBOX_LOGS, 409: ERROR})
    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(sandbox_id)
        return Response(logs_to_dict(sandbox, sandbox_logs(sandbox=sandbox, actor=self.actor)))
