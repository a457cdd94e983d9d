"""Account-level API endpoints."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from lab.api.base import ProjectAPIView


class WhoAmIView(ProjectAPIView):
    """``GET /api/v1/whoami``: the organization, project and scopes of the calling key."""

    @extend_schema(
        responses=inline_serializer(
            "WhoAmI",
            {
                "organization": serializers.DictField(),
                "project": serializers.DictField(),
                "scopes": serializers.ListField(child=serializers.CharField()),
            },
        )
    )
    def get(self, request: Request) -> Response:
        organization = self.project.organization
        return Response(
            {
                "organization": {"id": organization.public_id, "slug": organization.slug, "name": organization.name},
                "project": {"id": self.project.public_id, "slug": self.project.slug, "name": self.project.name},
                "scopes": list(self.api_key.scopes),
            }
        )
