"""Evaluation routes under /api/v1 (docs/evaluations.md)."""

from django.urls import path

from evaluations import views

urlpatterns = [
    path("evaluations", views.EvaluationListView.as_view(), name="api-evaluations"),
    path("evaluations/push", views.EvaluationPushView.as_view(), name="api-evaluation-push"),
    path("evaluations/<str:evaluation_id>", views.EvaluationDetailView.as_view(), name="api-evaluation"),
    path("evaluations/<str:evaluation_id>/cancel", views.EvaluationCancelView.as_view(), name="api-evaluation-cancel"),
    path("evaluations/<str:evaluation_id>/retry", views.EvaluationRetryView.as_view(), name="api-evaluation-retry"),
    path("evaluations/<str:evaluation_id>/finalize", views.EvaluationFinalizeView.as_view(), name="api-evaluation-finalize"),
    path("evaluations/<str:evaluation_id>/samples", views.EvaluationSamplesView.as_view(), name="api-evaluation-samples"),
]
