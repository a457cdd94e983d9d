"""REST endpoints for evaluations (docs/evaluations.md): thin over ``evaluations.services`` and
``evaluations.selectors``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from evaluations import openapi
from evaluations.models import Evaluation
from evaluations.pushes import evaluation_push_create, evaluation_push_finalize, evaluation_push_samples
from evaluations.selectors import evaluation_list, evaluation_samples, evaluations_to_dicts
from evaluations.serializers import sample_to_dict
from evaluations.services import evaluation_cancel, evaluation_create, evaluation_delete, evaluation_retry
from jobs.models import JobStatus
from lab.api.base import ProjectAPIView
from lab.api.pagination import paginate_by_public_id
from lab.api.schema import json_body, limit_parameter


class _EvaluationView(ProjectAPIView):
    def evaluation(self, evaluation_id: str) -> Evaluation:
        return self.get_owned(Evaluation.objects.select_related("job", "project__organization"), evaluation_id, "evaluation")

    def answer(self, evaluation: Evaluation, status: int = 200) -> Response:
        return Response(evaluations_to_dicts([evaluation])[0], status=status)


class EvaluationListView(_EvaluationView):
    """``GET /evaluations?status=`` (newest first); ``POST /evaluations`` (201, queued)."""

    @extend_schema(
        parameters=[
            limit_parameter(), OpenApiParameter("after", str),
            OpenApiParameter("status", str, enum=list(JobStatus.values), description="only evaluations of this status"),
        ],
        responses={200: openapi.EVALUATION_LIST},
    )
    def get(self, request: Request) -> Response:
        evaluations = evaluation_list(project=self.project, status=request.query_params.get("status"))
        return Response(paginate_by_public_id(evaluations, request.query_params, serialize_page=evaluations_to_dicts))

    @extend_schema(request=json_body(openapi.EVALUATION_CREATE), responses={201: openapi.EVALUATION})
    def post(self, request: Request) -> Response:
        evaluation = evaluation_create(project=self.project, actor=self.actor, data=request.data)
        return self.answer(evaluation, status=201)


class EvaluationDetailView(_EvaluationView):
    """``GET /evaluations/{id}``; ``DELETE`` (204) a finished one with its job and samples."""

    @extend_schema(responses={200: openapi.EVALUATION})
    def get(self, request: Request, evaluation_id: str) -> Response:
        return self.answer(self.evaluation(evaluation_id))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, evaluation_id: str) -> Response:
        evaluation_delete(evaluation=self.evaluation(evaluation_id), actor=self.actor)
        return Response(status=204)


class EvaluationCancelView(_EvaluationView):
    """``POST /evaluations/{id}/cancel``: ``cancelled`` at once while queued, else ``cancelling``."""

    @extend_schema(request=None, responses={200: openapi.EVALUATION})
    def post(self, request: Request, evaluation_id: str) -> Response:
        return self.answer(evaluation_cancel(evaluation=self.evaluation(evaluation_id), actor=self.actor))


class EvaluationRetryView(_EvaluationView):
    """``POST /evaluations/{id}/retry``: a failed or cancelled evaluation runs again (``queued``)."""

    @extend_schema(request=None, responses={200: openapi.EVALUATION})
    def post(self, request: Request, evaluation_id: str) -> Response:
        return self.answer(evaluation_retry(evaluation=self.evaluation(evaluation_id), actor=self.actor))


class EvaluationPushView(_EvaluationView):
    """``POST /evaluations/push``: an evaluation that ran elsewhere (201), or the one its
    ``push_id`` made already (200)."""

    @extend_schema(request=json_body(openapi.EVALUATION_PUSH), responses={200: openapi.EVALUATION, 201: openapi.EVALUATION})
    def post(self, request: Request) -> Response:
        evaluation, created = evaluation_push_create(project=self.project, actor=self.actor, data=request.data)
        return self.answer(evaluation, status=201 if created else 200)


class EvaluationFinalizeView(_EvaluationView):
    """``POST /evaluations/{id}/finalize``: a pushed evaluation's samples are all in; it ends with its results."""

    @extend_schema(request=None, responses={200: openapi.EVALUATION})
    def post(self, request: Request, evaluation_id: str) -> Response:
        return self.answer(evaluation_push_finalize(evaluation=self.evaluation(evaluation_id), actor=self.actor))


class EvaluationSamplesView(_EvaluationView):
    """``GET /evaluations/{id}/samples?environment=&min_reward=&max_reward=`` in the order stored;
    ``POST`` a batch of a pushed evaluation's samples."""

    @extend_schema(request=json_body(openapi.EVALUATION_SAMPLES_PUSH), responses={200: openapi.EVALUATION_SAMPLES_PUSHED})
    def post(self, request: Request, evaluation_id: str) -> Response:
        return Response(evaluation_push_samples(evaluation=self.evaluation(evaluation_id), data=request.data))

    @extend_schema(
        parameters=[
            limit_parameter(), OpenApiParameter("after", str, description="the id of the last sample seen"),
            OpenApiParameter("environment", str, description="only this environment's samples (its id)"),
            OpenApiParameter("min_reward", float, description="only samples with at least this reward"),
            OpenApiParameter("max_reward", float, description="only samples with at most this reward"),
        ],
        responses={200: openapi.EVALUATION_SAMPLE_LIST},
    )
    def get(self, request: Request, evaluation_id: str) -> Response:
        evaluation = self.evaluation(evaluation_id)
        samples = evaluation_samples(evaluation=evaluation, params=request.query_params)
        ids = [environment["id"] for environment in evaluation.environments]
        return Response(
            paginate_by_public_id(samples, request.query_params, lambda sample: sample_to_dict(sample, ids), newest_first=False)
        )
