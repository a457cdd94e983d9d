"""Ingest API views (engine → Lab, docs/ingest-api.md): thin adapters over ``jobs.ingest.services``."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from pydantic import BaseModel, ValidationError
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from jobs.api.views import ArchiveNegotiation
from jobs.artifacts.downloads import download_response
from jobs.artifacts.kinds import ArtifactKind
from jobs.checkpoints import adapter_for_engine, checkpoint_for_engine
from jobs.ingest import schemas, services
from jobs.ingest.tokens import SANDBOX_KEY_PREFIX, attempt_for_token
from jobs.models import JobAttempt
from jobs.sandboxes import sandbox_create_for_attempt, sandbox_grant_for_key, sandbox_key_for_attempt
from lab.api.auth import bearer_token
from lab.api.errors import ApiError, FieldError
from lab.api.throttling import over_limit
from lab.audit import Actor
from sandboxes.grants import SandboxGrant
from sandboxes.models import SandboxStatus
from sandboxes.serializers import sandbox_to_dict
from sandboxes.services import sandbox_access, sandbox_delete, sandbox_of_attempt

_INVALID = "Missing, malformed, expired or foreign job token."


class JobTokenAuthentication(BaseAuthentication):
    """Authenticate ``Authorization: Bearer ljt_...`` for the job named in the URL."""

    def authenticate(self, request) -> tuple[None, JobAttempt]:
        token = bearer_token(get_authorization_header(request))
        if token is None:
            raise AuthenticationFailed(_INVALID)
        job_id = request.parser_context["kwargs"].get("job_id", "")
        attempt = attempt_for_token(token, job_public_id=job_id)
        if attempt is None:
            raise AuthenticationFailed(_INVALID)
        return (None, attempt)

    def authenticate_header(self, request) -> str:
        return "Bearer"


class JobSandboxKeyAuthentication(BaseAuthentication):
    """Authenticate a job attempt's sandbox key (``Authorization: Bearer lsk_...``) on the routes
    that accept sandbox grants (Prime's sandbox API, ``LAB_SANDBOX_GRANT_AUTHENTICATION``):
    ``request.auth`` becomes its ``SandboxGrant``; any other kind of key is left to the next class."""

    def authenticate(self, request) -> tuple[None, SandboxGrant] | None:
        token = bearer_token(get_authorization_header(request))
        if token is None or not token.startswith(SANDBOX_KEY_PREFIX):
            return None
        grant = sandbox_grant_for_key(token)
        if grant is None:
            raise AuthenticationFailed("Unknown sandbox key, or its job attempt has ended.")
        return (None, grant)

    def authenticate_header(self, request) -> str:
        return "Bearer"


class HasJobToken(BasePermission):
    """Require a valid job token."""

    def has_permission(self, request, view) -> bool:
        if not isinstance(request.auth, JobAttempt):
            raise AuthenticationFailed(_INVALID)
        return True


class JobTokenRateThrottle(BaseThrottle):
    """Allow ``LAB_INGEST_RATE_LIMIT_PER_MINUTE`` ingest requests per job per minute."""

    def allow_request(self, request, view) -> bool:
        limited, self._wait = over_limit(f"job:{request.auth.job_id}", settings.LAB_INGEST_RATE_LIMIT_PER_MINUTE)
        return not limited

    def wait(self) -> float:
        return self._wait


def _parse(model: type[BaseModel], request: Request, batch_field: str | None = None) -> BaseModel:
    """Validate the body with ``model``; a batch over 1,000 items is 413, anything else bad is 400."""
    data = request.data
    if batch_field and isinstance(data, dict) and isinstance(data.get(batch_field), list):
        if len(data[batch_field]) > schemas.MAX_BATCH:
            raise ApiError(
                413, "request_too_large", f"At most {schemas.MAX_BATCH} {batch_field} per request.", param=batch_field
            )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [
            FieldError(".".join(str(part) for part in error["loc"]) or None, error["type"], error["msg"])
            for error in exc.errors(include_url=False)
        ]
        raise ApiError(400, "invalid_request", errors[0].message, errors=errors) from None


class IngestView(APIView):
    """Base of the ingest endpoints: job-token auth, per-job rate limit; ``self.attempt``."""

    authentication_classes = [JobTokenAuthentication]
    permission_classes = [HasJobToken]
    throttle_classes = [JobTokenRateThrottle]

    def initial(self, request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        self.attempt: JobAttempt = request.auth


class StatusView(IngestView):
    """``POST /ingest/jobs/{id}/status``: heartbeat → ``{"action": "continue"|"stop"}``."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        action = services.ingest_status(attempt=self.attempt, report=_parse(schemas.StatusReport, request))
        return Response({"action": action})


class MetricsView(IngestView):
    """``POST /ingest/jobs/{id}/metrics``."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        batch = _parse(schemas.MetricsBatch, request, "points")
        return Response(services.ingest_metrics(attempt=self.attempt, batch=batch))


class SamplesView(IngestView):
    """``POST /ingest/jobs/{id}/samples``."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        batch = _parse(schemas.SamplesBatch, request, "samples")
        return Response(services.ingest_samples(attempt=self.attempt, batch=batch))


class EvaluationSamplesView(IngestView):
    """``POST /ingest/jobs/{id}/evaluation-samples`` (an evaluation job's engine) → ``{"accepted", "duplicates"}``."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        batch = _parse(schemas.EvaluationSamplesBatch, request, "samples")
        return Response(services.ingest_evaluation_samples(attempt=self.attempt, batch=batch))


class LogsView(IngestView):
    """``POST /ingest/jobs/{id}/logs``."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        batch = _parse(schemas.LogsBatch, request, "lines")
        return Response(services.ingest_logs(attempt=self.attempt, batch=batch))


class ArtifactRegisterView(IngestView):
    """``POST /ingest/jobs/{id}/checkpoints`` or ``/adapters`` (``kind``) → 201 ``{"id", "upload"}``."""

    kind: ArtifactKind | None = None  # the route's (``as_view(kind=...)``)

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        report = _parse(schemas.ArtifactRegister, request)
        artifact, upload = services.artifact_register(self.kind, attempt=self.attempt, report=report)
        return Response({"id": artifact.public_id, "upload": upload}, status=201)


class ArtifactCompleteView(IngestView):
    """``POST /ingest/jobs/{id}/checkpoints/{checkpoint_id}/complete`` or
    ``/adapters/{adapter_id}/complete`` (``kind``) → ``{"id", "status"}``."""

    kind: ArtifactKind | None = None  # the route's (``as_view(kind=...)``)

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str, **artifact_id: str) -> Response:
        report = _parse(schemas.ArtifactComplete, request)
        artifact = services.artifact_complete(
            self.kind, attempt=self.attempt, artifact_id=artifact_id[self.kind.id_field], report=report
        )
        return Response({"id": artifact.public_id, "status": artifact.status})


class CheckpointDownloadView(IngestView):
    """``GET /ingest/jobs/{id}/checkpoints/{checkpoint_id}/download``: a checkpoint the engine
    starts from (the job's own, or its ``init_from``): the tar, or 302 to a signed URL."""

    content_negotiation_class = ArchiveNegotiation

    @extend_schema(exclude=True)
    def get(self, request: Request, job_id: str, checkpoint_id: str):
        checkpoint = checkpoint_for_engine(job=self.attempt.job, checkpoint_id=checkpoint_id)
        return download_response(checkpoint, request=request)


class AdapterDownloadView(IngestView):
    """``GET /ingest/jobs/{id}/adapters/{adapter_id}/download``: the adapter an evaluation job
    evaluates (its ``[eval] adapter``): the tar, or 302 to a signed URL."""

    content_negotiation_class = ArchiveNegotiation

    @extend_schema(exclude=True)
    def get(self, request: Request, job_id: str, adapter_id: str):
        adapter = adapter_for_engine(job=self.attempt.job, adapter_id=adapter_id)
        return download_response(adapter, request=request)


class FinishView(IngestView):
    """``POST /ingest/jobs/{id}/finish``."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        services.ingest_finish(attempt=self.attempt, report=_parse(schemas.FinishReport, request))
        return Response({"ok": True})


class SandboxesView(IngestView):
    """``POST /ingest/jobs/{id}/sandboxes``: a sandbox for this attempt's environments (the body of
    ``POST /sandboxes``) → 201, the Sandbox with its ``data_plane`` access (docs/sandboxes.md
    "Sandboxes of a job"); a sandbox its runtime could not start is ``failed``, with no access."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        sandbox, warnings = sandbox_create_for_attempt(attempt=self.attempt, data=request.data)
        access = sandbox_access(sandbox=sandbox) if sandbox.status == SandboxStatus.RUNNING else None
        return Response(sandbox_to_dict(sandbox, warnings=warnings, access=access), status=201)


class SandboxKeyView(IngestView):
    """``POST /ingest/jobs/{id}/sandbox-key`` → ``{"api_key", "base_url", "data_plane_url"}``: the
    attempt's sandbox key, where Prime's sandbox API is on Lab and where its sandboxes' commands
    go, for its environments' ``prime-sandboxes`` (``PRIME_API_KEY``, ``PRIME_API_BASE_URL``); 409
    once the attempt has ended."""

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        key = sandbox_key_for_attempt(attempt=self.attempt)
        return Response({"api_key": key, "base_url": f"{settings.LAB_PUBLIC_URL}/prime",
                         "data_plane_url": settings.LAB_SANDBOX_DATA_PLANE_URL})


class SandboxView(IngestView):
    """``DELETE /ingest/jobs/{id}/sandboxes/{sandbox_id}`` → 204 (idempotent): a sandbox this
    attempt made; any other is 404."""

    @extend_schema(exclude=True)
    def delete(self, request: Request, job_id: str, sandbox_id: str) -> Response:
        sandbox_delete(sandbox=sandbox_of_attempt(attempt_id=self.attempt.pk, sandbox_id=sandbox_id), actor=Actor.system())
        return Response(status=204)
