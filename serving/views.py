"""REST endpoints of deployments (docs/serving.md): thin over ``serving.services``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError
from lab.api.pagination import paginate_by_public_id
from lab.api.schema import json_body, limit_parameter
from serving import openapi
from serving.models import Deployment, DeploymentEvent, DeploymentStatus
from serving.serializers import deployment_to_dict, deployments_to_dicts, event_to_dict
from serving.services import deployment_create, deployment_delete


class _DeploymentView(ProjectAPIView):
    def deployment(self, deployment_id: str) -> Deployment:
        return self.get_owned(Deployment.objects.select_related("server", "project__organization"), deployment_id, "deployment")


class DeploymentListView(_DeploymentView):
    """``GET /deployments?status=`` (newest first); ``POST /deployments`` (201, ``pending``)."""

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str), OpenApiParameter("status", str, enum=list(DeploymentStatus.values))],
        responses={200: openapi.DEPLOYMENT_LIST},
    )
    def get(self, request: Request) -> Response:
        deployments = Deployment.objects.for_project(self.project).select_related("server")
        status = request.query_params.get("status")
        if status:
            if status not in DeploymentStatus.values:
                raise ApiError(400, "invalid_request", f"status must be one of {', '.join(DeploymentStatus.values)}.", param="status")
            deployments = deployments.filter(status=status)
        return Response(paginate_by_public_id(deployments, request.query_params, serialize_page=deployments_to_dicts))

    @extend_schema(request=json_body(openapi.DEPLOYMENT_CREATE), responses={201: openapi.DEPLOYMENT})
    def post(self, request: Request) -> Response:
        deployment = deployment_create(project=self.project, actor=self.actor, data=request.data)
        return Response(deployment_to_dict(deployment), status=201)


class DeploymentDetailView(_DeploymentView):
    """``GET /deployments/{id}``; ``DELETE`` (200: the deployment, ``unloading`` until its server lets it go)."""

    @extend_schema(responses={200: openapi.DEPLOYMENT})
    def get(self, request: Request, deployment_id: str) -> Response:
        return Response(deployment_to_dict(self.deployment(deployment_id)))

    @extend_schema(responses={200: openapi.DEPLOYMENT})
    def delete(self, request: Request, deployment_id: str) -> Response:
        return Response(deployment_to_dict(deployment_delete(deployment=self.deployment(deployment_id), actor=self.actor)))


class DeploymentEventsView(_DeploymentView):
    """``GET /deployments/{id}/events`` (oldest first)."""

    @extend_schema(parameters=[limit_parameter(), OpenApiParameter("after", str)], responses={200: openapi.DEPLOYMENT_EVENT_LIST})
    def get(self, request: Request, deployment_id: str) -> Response:
        events = DeploymentEvent.objects.filter(deployment=self.deployment(deployment_id))
        return Response(paginate_by_public_id(events, request.query_params, event_to_dict, newest_first=False))
