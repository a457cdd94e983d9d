"""``POST /api/v1/ingest/jobs/{job_id}/attempts``: an engine pod on the Kubernetes pool opens
the attempt it runs (docs/ingest-api.md "Opening an attempt"); a thin adapter over
``jobs.readmission.attempt_open_for_pod``.

Authenticated by the job's bootstrap token (``ljb_...``, ``jobs.ingest.tokens``), which this
endpoint alone accepts; a job token (``ljt_...``) or an API key is refused here like a bad one,
and so is a bootstrap token whose JobSet no longer runs the job (it ended, restarted or was
launched again). A token opens attempts in the JobSet it was launched with only.
"""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from pydantic import BaseModel, ConfigDict, Field
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from jobs.ingest.tokens import bootstrap_launch_for_token
from jobs.ingest.views import _parse
from jobs.models import JobAttempt
from jobs.readmission import RETRY_AFTER_S, attempt_open_for_pod
from lab.api.auth import bearer_token
from lab.api.errors import ApiError
from lab.api.throttling import over_limit

_INVALID = "Missing, malformed, foreign or expired bootstrap token."
_KUBERNETES_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class AttemptOpen(BaseModel):
    """The body: the pod's uid (the downward API's ``metadata.uid``) and its JobSet's name."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Kubernetes names and uids are ASCII letters, digits, "-", "." and "_" at most; anything else
    # (NUL above all, which the attempt's JSON handle cannot store) is a 400, not a 500.
    pod_uid: str = Field(min_length=1, max_length=64, pattern=_KUBERNETES_NAME)
    jobset: str = Field(min_length=1, max_length=63, pattern=_KUBERNETES_NAME)


class BootstrapTokenAuthentication(BaseAuthentication):
    """Authenticate ``Authorization: Bearer ljb_...`` for the job named in the URL; ``request.auth``
    becomes the attempt whose launch the token was made for (with its job)."""

    def authenticate(self, request) -> tuple[None, JobAttempt]:
        token = bearer_token(get_authorization_header(request))
        job_id = request.parser_context["kwargs"].get("job_id", "")
        launch = None if token is None else bootstrap_launch_for_token(token, job_public_id=job_id)
        if launch is None:
            raise AuthenticationFailed(_INVALID)
        return (None, launch)

    def authenticate_header(self, request) -> str:
        return "Bearer"


class HasBootstrapToken(BasePermission):
    """Require a valid bootstrap token."""

    def has_permission(self, request, view) -> bool:
        if not isinstance(request.auth, JobAttempt):
            raise AuthenticationFailed(_INVALID)
        return True


class BootstrapRateThrottle(BaseThrottle):
    """Share the job's ingest rate limit (``LAB_INGEST_RATE_LIMIT_PER_MINUTE``)."""

    def allow_request(self, request, view) -> bool:
        job_id = request.auth.job.public_id
        limited, self._wait = over_limit(f"job-bootstrap:{job_id}", settings.LAB_INGEST_RATE_LIMIT_PER_MINUTE)
        return not limited

    def wait(self) -> float:
        return self._wait


class AttemptsView(APIView):
    """``POST /ingest/jobs/{id}/attempts`` → ``{"attempt", "token", "resume_from"}``."""

    authentication_classes = [BootstrapTokenAuthentication]
    permission_classes = [HasBootstrapToken]
    throttle_classes = [BootstrapRateThrottle]

    @extend_schema(exclude=True)
    def post(self, request: Request, job_id: str) -> Response:
        body = _parse(AttemptOpen, request)
        launched_in = request.auth.handle.get("jobset")
        # The token's JobSet is fixed once its launch is recorded; the service checks, under the
        # job's lock, that the body's JobSet runs the job, so the two together tie the token to it.
        if not launched_in:
            raise ApiError(409, "attempt_not_ready", "The attempt's launch is not recorded yet; ask again.",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        if body.jobset != launched_in:
            raise ApiError(409, "invalid_state", "This JobSet does not run the job's current attempt.")
        grant = attempt_open_for_pod(job_public_id=job_id, pod_uid=body.pod_uid, jobset=body.jobset)
        return Response(grant.as_dict())
