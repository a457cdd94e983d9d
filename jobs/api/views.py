"""REST endpoints for jobs and the catalogues (docs/api.md). Thin over services."""

from __future__ import annotations

from django.http import JsonResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema, extend_schema_view
from labsdk.spec import job_spec_json_schema
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.models import Price
from jobs.api import openapi
from jobs.artifacts.downloads import ARCHIVE_SHA256_HEADER, archive_file_response, download_response
from jobs.artifacts.kinds import ADAPTER, CHECKPOINT, ArtifactKind
from jobs.artifacts.lifecycle import artifact_list
from jobs.artifacts.presenters import artifact_to_dict
from jobs.estimates import job_estimate
from jobs.model_archives import model_archive
from jobs.models import Adapter, Job, JobEvent, JobKind, JobStatus
from jobs.selectors import job_list, job_logs, job_samples, metadata_filters, metric_points
from jobs.serializers import (
    event_to_dict,
    job_to_dict,
    jobs_to_dicts,
    price_to_dict,
)
from jobs.services import job_cancel, job_delete, job_restart, job_submit
from lab.api.base import ProjectAPIView
from lab.api.pagination import paginate_by_public_id
from lab.api.schema import ERROR, integer_parameter, json_body, limit_parameter
from lab.paging import list_envelope

_SPEC_BODY = json_body(openapi.JOB_CREATE)


class JobListView(ProjectAPIView):
    """``GET /jobs`` (newest first; training jobs unless ``kind`` says otherwise; ``status`` and
    ``metadata[key]=value`` filters); ``POST /jobs``."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "kind", str, enum=JobKind.values,
                description="keep jobs of this kind (default training; evaluation: the jobs of evaluations)",
            ),
            OpenApiParameter("status", str, enum=JobStatus.values, description="keep jobs with this status"),
            limit_parameter(),
            OpenApiParameter("after", str, description="id of the last job seen"),
        ],
        responses={200: openapi.JOB_LIST},
    )
    def get(self, request: Request) -> Response:
        jobs = job_list(
            project=self.project,
            status=request.query_params.get("status"),
            metadata=metadata_filters(request.query_params),
            kind=request.query_params.get("kind") or JobKind.TRAINING,
        )
        return Response(paginate_by_public_id(jobs, request.query_params, serialize_page=jobs_to_dicts))

    @extend_schema(request=_SPEC_BODY, responses={201: openapi.JOB, 402: ERROR})
    def post(self, request: Request) -> Response:
        job = job_submit(project=self.project, actor=self.actor, data=request.data)
        return Response(job_to_dict(job), status=201)


class JobDetailView(ProjectAPIView):
    """``GET /jobs/{id}``; ``DELETE /jobs/{id}`` (finished jobs, with all their data)."""

    @extend_schema(responses={200: openapi.JOB})
    def get(self, request: Request, job_id: str) -> Response:
        return Response(job_to_dict(self.get_owned(Job.objects.all(), job_id, "job")))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, job_id: str) -> Response:
        job_delete(job=self.get_owned(Job.objects.all(), job_id, "job"), actor=self.actor)
        return Response(status=204)


class JobRestartView(ProjectAPIView):
    """``POST /jobs/{id}/restart``: a failed or cancelled training job runs again from its latest
    checkpoint; an evaluation's job is a 400 naming ``POST /evaluations/{id}/retry``."""

    @extend_schema(request=None, responses={200: openapi.JOB, 402: ERROR})
    def post(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(job_to_dict(job_restart(job=job, actor=self.actor)))


class JobMetricsView(ProjectAPIView):
    """``GET /jobs/{id}/metrics?after_step=&names=&max_points=``."""

    @extend_schema(
        parameters=[
            integer_parameter("after_step", minimum=-1, maximum=10**9, description="steps after this one"),
            OpenApiParameter("names", str, description="comma-separated metric names to keep"),
            integer_parameter("max_points", minimum=2, maximum=10_000, description="downsample to at most this many"),
            limit_parameter(default=1000, maximum=10_000),
        ],
        responses={200: openapi.METRIC_POINT_LIST},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(metric_points(job=job, params=request.query_params))


class JobSamplesView(ProjectAPIView):
    """``GET /jobs/{id}/samples?step=``."""

    @extend_schema(
        parameters=[
            integer_parameter("step", minimum=0, maximum=10**9, description="default: the latest step with samples"),
            limit_parameter(default=100, maximum=1000),
        ],
        responses={200: openapi.ROLLOUT_SAMPLE_LIST},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(job_samples(job=job, params=request.query_params))


class JobLogsView(ProjectAPIView):
    """``GET /jobs/{id}/logs?after=``."""

    @extend_schema(
        parameters=[
            integer_parameter("after", minimum=0, maximum=2**62, description="seq of the last line seen"),
            limit_parameter(default=100, maximum=1000),
        ],
        responses={200: openapi.LOG_LINE_LIST},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(job_logs(job=job, params=request.query_params))


class ArchiveNegotiation(DefaultContentNegotiation):
    """Answer a download whatever its ``Accept`` says (``application/x-tar``, ``*/*``): the body
    is the archive, or JSON for an error."""

    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except NotAcceptable:  # the archive is the answer anyway
            return renderers[0], renderers[0].media_type


def _list_schema(page: dict):
    """The schema of a job's artifacts list: ``limit`` and ``after`` paging over ``page``."""
    return extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str, description="id of the last one seen")],
        responses={200: page},
    )


def _download_schema(kind: ArtifactKind, description: str):
    """The schema of an artifact's download: the tar, a redirect, or 409 when it is not ready."""
    return extend_schema(
        operation_id=f"{kind.name}s_download",
        responses={(200, "application/x-tar"): OpenApiTypes.BINARY, 302: None, 409: ERROR},
        description=description,
    )


class JobArtifactsView(ProjectAPIView):
    """A job's artifacts of ``kind``, newest first."""

    kind: ArtifactKind

    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(paginate_by_public_id(artifact_list(self.kind, job=job), request.query_params, artifact_to_dict))


class ArtifactDownloadView(ProjectAPIView):
    """An artifact's archive (``jobs.artifacts.downloads.download_response``)."""

    kind: ArtifactKind
    project_field = "job__project"
    content_negotiation_class = ArchiveNegotiation

    def get(self, request: Request, **artifact_id: str):
        artifact = self.get_owned(self.kind.model.objects.select_related("job"), artifact_id[self.kind.id_field], self.kind.name)
        return download_response(artifact, request=request)


@extend_schema_view(get=_list_schema(openapi.CHECKPOINT_LIST))
class JobCheckpointsView(JobArtifactsView):
    """``GET /jobs/{id}/checkpoints``, newest first."""

    kind = CHECKPOINT


@extend_schema_view(
    get=_download_schema(
        CHECKPOINT, "The checkpoint archive (one uncompressed tar), or a redirect to a short-lived signed URL."
    )
)
class CheckpointDownloadView(ArtifactDownloadView):
    """``GET /checkpoints/{id}/download``: the ready checkpoint's tar, or 302 to a signed URL.

    404 for an unknown id or another project's checkpoint; 409 ``checkpoint_not_ready`` for one
    that is not ``ready`` (pending, uploading or failed).
    """

    kind = CHECKPOINT


@extend_schema_view(get=_list_schema(openapi.ADAPTER_LIST))
class JobAdaptersView(JobArtifactsView):
    """``GET /jobs/{id}/adapters``, newest first (``[adapters]`` in the spec)."""

    kind = ADAPTER


class AdapterDetailView(ProjectAPIView):
    """``GET /adapters/{id}``: one Adapter (its ``sha256`` lets a client check a download)."""

    @extend_schema(responses={200: openapi.ADAPTER})
    def get(self, request: Request, adapter_id: str) -> Response:
        return Response(artifact_to_dict(self.get_owned(Adapter.objects.select_related("job"), adapter_id, "adapter")))


@extend_schema_view(
    get=_download_schema(
        ADAPTER,
        "The adapter archive (one uncompressed tar of a PEFT or Hugging Face directory, no optimizer "
        "state), or a redirect to a short-lived signed URL.",
    )
)
class AdapterDownloadView(ArtifactDownloadView):
    """``GET /adapters/{id}/download``: the ready adapter's tar, or 302 to a signed URL.

    404 for an unknown id or another project's adapter; 409 ``adapter_not_ready`` for one that
    is not ``ready`` (uploading, failed or deleted).
    """

    kind = ADAPTER


class JobCancelView(ProjectAPIView):
    """``POST /jobs/{id}/cancel``: ``cancelled`` at once if queued, else ``cancelling``."""

    @extend_schema(request=None, responses={200: openapi.JOB})
    def post(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(job_to_dict(job_cancel(job=job, actor=self.actor)))


class JobEventsView(ProjectAPIView):
    """``GET /jobs/{id}/events``, oldest first."""

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str, description="id of the last one seen")],
        responses={200: openapi.JOB_EVENT_LIST},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        events = JobEvent.objects.filter(job=job).select_related("job")
        return Response(paginate_by_public_id(events, request.query_params, event_to_dict, newest_first=False))


class JobEstimateView(ProjectAPIView):
    """``POST /jobs/estimate``: full validation and an estimate, creating nothing; read keys may call it."""

    required_scope = "read"

    @extend_schema(request=_SPEC_BODY, responses={200: openapi.ESTIMATE})
    def post(self, request: Request) -> Response:
        return Response(job_estimate(project=self.project, data=request.data))


class ModelArchiveView(ProjectAPIView):
    """``GET /models/{owner}/{name}/archive``: the stored directory of a catalogue model as one
    uncompressed tar (``jobs.model_archives``), streamed, with its SHA-256 in
    ``X-Lab-Archive-SHA256``, for the SDK's own model cache; any key of the organization may read
    it. 404 for a model not in the catalogue, or one that is built rather than stored."""

    content_negotiation_class = ArchiveNegotiation

    @extend_schema(
        operation_id="models_archive",
        responses={(200, "application/x-tar"): OpenApiTypes.BINARY, 404: ERROR},
        description="The model's Hugging Face directory as one uncompressed tar.",
    )
    def get(self, request: Request, owner: str, name: str):
        archive = model_archive(f"{owner}/{name}", organization=self.project.organization)
        response = archive_file_response(archive.path.open("rb"), request=request, filename=archive.filename, size_bytes=archive.size_bytes)
        response[ARCHIVE_SHA256_HEADER] = archive.sha256
        return response


class PriceListView(ProjectAPIView):
    """``GET /prices``: USD per hour for each resource type."""

    @extend_schema(responses={200: openapi.PRICE_LIST})
    def get(self, request: Request) -> Response:
        return Response(list_envelope(map(price_to_dict, Price.objects.all()), has_more=False))


class JobSpecSchemaView(APIView):
    """``GET /schema/job-spec.json``: the JSON Schema of a job spec (public)."""

    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []

    @extend_schema(operation_id="schema_job_spec_retrieve", responses={200: openapi.JSON_SCHEMA_DOCUMENT})
    def get(self, request: Request) -> JsonResponse:
        return JsonResponse(job_spec_json_schema())
