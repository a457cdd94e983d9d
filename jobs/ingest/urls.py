"""Ingest routes under /api/v1/ingest/jobs/{job_id}."""

from django.urls import path

from jobs.artifacts.kinds import ADAPTER, CHECKPOINT
from jobs.ingest import bootstrap, views

urlpatterns = [
    path("<str:job_id>/status", views.StatusView.as_view(), name="ingest-status"),
    path("<str:job_id>/metrics", views.MetricsView.as_view(), name="ingest-metrics"),
    path("<str:job_id>/samples", views.SamplesView.as_view(), name="ingest-samples"),
    path("<str:job_id>/logs", views.LogsView.as_view(), name="ingest-logs"),
    path(
        "<str:job_id>/evaluation-samples", views.EvaluationSamplesView.as_view(), name="ingest-evaluation-samples"
    ),
    path("<str:job_id>/checkpoints", views.ArtifactRegisterView.as_view(kind=CHECKPOINT), name="ingest-checkpoints"),
    path(
        "<str:job_id>/checkpoints/<str:checkpoint_id>/complete",
        views.ArtifactCompleteView.as_view(kind=CHECKPOINT),
        name="ingest-checkpoint-complete",
    ),
    path(
        "<str:job_id>/checkpoints/<str:checkpoint_id>/download",
        views.CheckpointDownloadView.as_view(),
        name="ingest-checkpoint-download",
    ),
    path("<str:job_id>/adapters", views.ArtifactRegisterView.as_view(kind=ADAPTER), name="ingest-adapters"),
    path(
        "<str:job_id>/adapters/<str:adapter_id>/complete",
        views.ArtifactCompleteView.as_view(kind=ADAPTER),
        name="ingest-adapter-complete",
    ),
    path(
        "<str:job_id>/adapters/<str:adapter_id>/download",
        views.AdapterDownloadView.as_view(),
        name="ingest-adapter-download",
    ),
    path("<str:job_id>/finish", views.FinishView.as_view(), name="ingest-finish"),
    path("<str:job_id>/attempts", bootstrap.AttemptsView.as_view(), name="ingest-attempts"),
    path("<str:job_id>/sandboxes", views.SandboxesView.as_view(), name="ingest-sandboxes"),
    path("<str:job_id>/sandbox-key", views.SandboxKeyView.as_view(), name="ingest-sandbox-key"),
    path("<str:job_id>/sandboxes/<str:sandbox_id>", views.SandboxView.as_view(), name="ingest-sandbox"),
]
