"""Account-level API endpoints."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from lab.api.base import ProjectAPIView
from lab.api.schema import STRING, component, obj
from lab.models import ApiKeyScope

_NAMED = obj({"id": STRING, "slug": STRING, "name": STRING})
WHOAMI = component(
    "WhoAmI",
    obj(
        {
            "organization": _NAMED,
            "project": _NAMED,
            "scopes": {"type": "array", "items": {"type": "string", "enum": list(ApiKeyScope.values)}},
        },
        description="The organization, project and scopes of the calling API key.",
    ),
)


class WhoAmIView(ProjectAPIView):
    """``GET /api/v1/whoami``: the organization, project and scopes of the calling key."""

    @extend_schema(operation_id="whoami_retrieve", responses={200: WHOAMI})
    def get(self, request: Request) -> Response:
        organization = self.project.organization
        return Response(
            {
                "organization": {"id": organization.public_id, "slug": organization.slug, "name": organization.name},
                "project": {"id": self.project.public_id, "slug": self.project.slug, "name": self.project.name},
                "scopes": list(self.api_key.scopes),
            }
        )
