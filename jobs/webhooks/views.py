"""REST endpoints for webhook endpoints and their deliveries. Thin over ``jobs.webhooks.endpoints``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.webhooks import openapi
from jobs.webhooks.endpoints import (
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_rotate_secret,
    endpoint_send_test,
    endpoint_update,
)
from jobs.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from jobs.webhooks.serializers import delivery_to_dict, endpoint_to_dict
from lab.api.base import ProjectAPIView
from lab.api.errors import ApiError, FieldError, not_found
from lab.api.idempotency import replay_as
from lab.api.pagination import paginate_by_public_id
from lab.api.schema import json_body, limit_parameter


class _EndpointView(ProjectAPIView):
    def endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        return self.get_owned(WebhookEndpoint.objects.all(), endpoint_id, "webhook endpoint")


class EndpointListView(_EndpointView):
    """``GET /webhook-endpoints`` (newest first); ``POST /webhook-endpoints`` (answer carries the secret;
    an ``Idempotency-Key`` replay answers without it)."""

    @extend_schema(
        parameters=[limit_parameter(), OpenApiParameter("after", str)],
        responses={200: openapi.WEBHOOK_ENDPOINT_LIST},
    )
    def get(self, request: Request) -> Response:
        return Response(
            paginate_by_public_id(self.scoped(WebhookEndpoint.objects.all()), request.query_params, endpoint_to_dict)
        )

    @extend_schema(
        request=json_body(openapi.WEBHOOK_ENDPOINT_CREATE), responses={201: openapi.WEBHOOK_ENDPOINT_WITH_SECRET}
    )
    def post(self, request: Request) -> Response:
        endpoint = endpoint_create(project=self.project, actor=self.actor, data=request.data)
        answer = Response(endpoint_to_dict(endpoint, include_secret=True), status=201)
        return replay_as(answer, endpoint_to_dict(endpoint))


class EndpointDetailView(_EndpointView):
    """``GET``, ``PATCH`` (url, events, enabled) and ``DELETE /webhook-endpoints/{id}``."""

    @extend_schema(responses={200: openapi.WEBHOOK_ENDPOINT})
    def get(self, request: Request, endpoint_id: str) -> Response:
        return Response(endpoint_to_dict(self.endpoint(endpoint_id)))

    @extend_schema(request=json_body(openapi.WEBHOOK_ENDPOINT_UPDATE), responses={200: openapi.WEBHOOK_ENDPOINT})
    def patch(self, request: Request, endpoint_id: str) -> Response:
        endpoint = endpoint_update(endpoint=self.endpoint(endpoint_id), actor=self.actor, data=request.data)
        return Response(endpoint_to_dict(endpoint))

    @extend_schema(responses={204: None})
    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint_delete(endpoint=self.endpoint(endpoint_id), actor=self.actor)
        return Response(status=204)


class EndpointRotateSecretView(_EndpointView):
    """``POST /webhook-endpoints/{id}/rotate-secret``: a new secret (the old one signs for 24 h more);
    an ``Idempotency-Key`` replay answers without it."""

    @extend_schema(request=None, responses={200: openapi.WEBHOOK_ENDPOINT_WITH_SECRET})
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = endpoint_rotate_secret(endpoint=self.endpoint(endpoint_id), actor=self.actor)
        return replay_as(Response(endpoint_to_dict(endpoint, include_secret=True)), endpoint_to_dict(endpoint))


class EndpointTestView(_EndpointView):
    """``POST /webhook-endpoints/{id}/test``: send a ``webhook.test`` event; 202 with its delivery."""

    @extend_schema(request=None, responses={202: openapi.WEBHOOK_DELIVERY})
    def post(self, request: Request, endpoint_id: str) -> Response:
        delivery = endpoint_send_test(endpoint=self.endpoint(endpoint_id), actor=self.actor)
        return Response(delivery_to_dict(delivery), status=202)


class DeliveryListView(_EndpointView):
    """``GET /webhook-endpoints/{id}/deliveries?status=``: newest first, each with its attempts."""

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=DeliveryStatus.values),
            limit_parameter(),
            OpenApiParameter("after", str),
        ],
        responses={200: openapi.WEBHOOK_DELIVERY_LIST},
    )
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = self.endpoint(endpoint_id)
        deliveries = WebhookDelivery.objects.filter(endpoint=endpoint).select_related("message", "endpoint")
        status = request.query_params.get("status")
        if status:
            if status not in DeliveryStatus.values:
                message = f"status must be one of {', '.join(DeliveryStatus.values)}."
                raise ApiError(400, "invalid_request", message, errors=[FieldError("status", "invalid", message)])
            deliveries = deliveries.filter(status=status)
        deliveries = deliveries.prefetch_related("attempts")
        return Response(paginate_by_public_id(deliveries, request.query_params, delivery_to_dict))


class DeliveryRedeliverView(_EndpointView):
    """``POST /webhook-endpoints/{id}/deliveries/{delivery_id}/redeliver``: try again now; 202."""

    @extend_schema(request=None, responses={202: openapi.WEBHOOK_DELIVERY})
    def post(self, request: Request, endpoint_id: str, delivery_id: str) -> Response:
        endpoint = self.endpoint(endpoint_id)
        delivery = WebhookDelivery.objects.filter(endpoint=endpoint, public_id=delivery_id[:64]).first()
        if delivery is None:
            raise not_found("webhook delivery")
        delivery = delivery_redeliver(delivery=delivery, actor=self.actor)
        delivery = WebhookDelivery.objects.select_related("message", "endpoint").get(pk=delivery.pk)
        return Response(delivery_to_dict(delivery), status=202)
