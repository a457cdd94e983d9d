"""Webhook endpoint routes under /api/v1 (docs/api.md)."""

from django.urls import path

from jobs.webhooks import views

urlpatterns = [
    path("webhook-endpoints", views.EndpointListView.as_view(), name="api-webhook-endpoints"),
    path("webhook-endpoints/<str:endpoint_id>", views.EndpointDetailView.as_view(), name="api-webhook-endpoint"),
    path(
        "webhook-endpoints/<str:endpoint_id>/rotate-secret",
        views.EndpointRotateSecretView.as_view(),
        name="api-webhook-endpoint-rotate-secret",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/test", views.EndpointTestView.as_view(), name="api-webhook-endpoint-test"
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/deliveries",
        views.DeliveryListView.as_view(),
        name="api-webhook-deliveries",
    ),
    path(
        "webhook-endpoints/<str:endpoint_id>/deliveries/<str:delivery_id>/redeliver",
        views.DeliveryRedeliverView.as_view(),
        name="api-webhook-delivery-redeliver",
    ),
]
