"""REST endpoints for pushed datasets (docs/environments.md "Datasets"): ``POST /datasets``
(multipart ``file`` and ``name``), ``GET /datasets``, ``GET``/``DELETE /datasets/{owner}/{name}``.
Thin over ``environments.datasets``; the organization comes from the API key."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from environments import openapi
from environments.datasets import dataset_delete, dataset_get, dataset_list, dataset_push
from environments.serializers import dataset_to_dict
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError
from lab.api.pagination import paginate_list
from lab.api.parsers import LabJSONParser
from lab.api.schema import limit_parameter

_PUSH_BODY = {
    "multipart/form-data": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "the name load_dataset is called with: <owner>/<name>"},
            "file": {
                "type": "string",
                "format": "binary",
                "description": "a data file, or a .tar/.tar.gz/.zip of the dataset's folder; at most 100 MB",
            },
        },
        "required": ["name", "file"],
    }
}


class DatasetListView(ProjectAPIView):
    """``GET /datasets``: the organization's pushed datasets; ``POST /datasets``: push one."""

    parser_classes = [MultiPartParser, LabJSONParser]

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str, description="id of the last dataset seen")],
        responses={200: openapi.DATASET_LIST},
    )
    def get(self, request: Request) -> Response:
        items = [dataset_to_dict(snapshot) for snapshot in dataset_list(organization=self.project.organization)]
        return Response(paginate_list(items, request.query_params))

    @extend_schema(request=_PUSH_BODY, responses={200: openapi.DATASET, 201: openapi.DATASET})
    def post(self, request: Request) -> Response:
        upload = request.FILES.get("file") if hasattr(request, "FILES") else None
        if upload is None:
            raise ApiError(
                400, "invalid_request", "Send the dataset as the multipart/form-data field 'file'.", param="file"
            )
        name = request.data.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(
                400, "invalid_request", "Send the dataset's name (<owner>/<name>) as the field 'name'.", param="name"
            )
        snapshot, created = dataset_push(
            organization=self.project.organization,
            actor=self.actor,
            dataset_id=name,
            handle=upload,
            filename=upload.name or "",
            size_bytes=upload.size,
        )
        return Response(dataset_to_dict(snapshot), status=201 if created else 200)

    # A push replaces the name's snapshot with these files: the same request again leaves the
    # same state, so Idempotency-Key's replay, which would hold the upload in memory, is not needed.
    post.is_idempotent = True


class DatasetDetailView(ProjectAPIView):
    """``GET``/``DELETE /datasets/{owner}/{name}``: one of the organization's pushed datasets."""

    @extend_schema(responses={200: openapi.DATASET})
    def get(self, request: Request, owner: str, name: str) -> Response:
        return Response(
            dataset_to_dict(dataset_get(organization=self.project.organization, dataset_id=f"{owner}/{name}"))
        )

    @extend_schema(responses={204: None})
    def delete(self, request: Request, owner: str, name: str) -> Response:
        dataset_delete(organization=self.project.organization, actor=self.actor, dataset_id=f"{owner}/{name}")
        return Response(status=204)
