"""``GET /jobs/{id}/distributions``: a histogram of one step's rollout rewards or advantages
(``jobs.distributions``). Thin over the selector."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.distributions import DISTRIBUTION_TYPES, MAX_BINS, job_distribution
from jobs.models import Job
from lab.api.base import ProjectAPIView
from lab.api.schema import INTEGER, NUMBER, STRING, component, integer_parameter, nullable, obj

DISTRIBUTION = component(
    "Distribution",
    obj(
        {
            "object": {"const": "distribution"},
            "job_id": STRING,
            "step": nullable(INTEGER) | {"description": "null before the job's first samples"},
            "type": {"type": "string", "enum": list(DISTRIBUTION_TYPES)},
            "count": INTEGER | {"description": "rollout samples the histogram is built from"},
            "min": nullable(NUMBER),
            "max": nullable(NUMBER),
            "mean": nullable(NUMBER),
            "bins": {
                "type": "array",
                "items": obj({"low": NUMBER, "high": NUMBER, "count": INTEGER}),
                "description": "equal-width bins over [min, max], the last one closed",
            },
        },
        description="A histogram of one step's stored rollout rewards or advantages.",
    ),
)


class JobDistributionView(ProjectAPIView):
    """``GET /jobs/{id}/distributions?step=&type=reward|advantage&bins=``."""

    @extend_schema(
        parameters=[
            integer_parameter("step", minimum=0, maximum=10**9, description="default: the latest step with samples"),
            OpenApiParameter("type", str, enum=list(DISTRIBUTION_TYPES), description="default: reward"),
            integer_parameter("bins", minimum=1, maximum=MAX_BINS, description="default: 10"),
        ],
        operation_id="jobs_distributions_retrieve",
        responses={200: DISTRIBUTION},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.get_owned(Job.objects.all(), job_id, "job")
        return Response(job_distribution(job=job, params=request.query_params))
