"""Deployment routes and the OpenAI-compatible API under /api/v1 (docs/serving.md)."""

from django.urls import path

from serving import views
from serving.api import views as inference

urlpatterns = [
    path("deployments", views.DeploymentListView.as_view(), name="api-deployments"),
    path("deployments/<str:deployment_id>", views.DeploymentDetailView.as_view(), name="api-deployment"),
    path("deployments/<str:deployment_id>/events", views.DeploymentEventsView.as_view(), name="api-deployment-events"),
    path("openai/v1/chat/completions", inference.chat_completions, name="openai-chat-completions"),
    path("openai/v1/completions", inference.completions, name="openai-completions"),
    path("openai/v1/models", inference.models, name="openai-models"),
]
