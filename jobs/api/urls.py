"""Job and catalogue endpoints under /api/v1."""

from django.urls import include, path

from jobs.api import distributions, environments, models, views
from jobs.stream.views import job_stream

urlpatterns = [
    path("ingest/jobs/", include("jobs.ingest.urls")),
    path("", include("jobs.webhooks.urls")),
    path("jobs", views.JobListView.as_view(), name="api-jobs"),
    path("jobs/estimate", views.JobEstimateView.as_view(), name="api-job-estimate"),
    path("jobs/<str:job_id>", views.JobDetailView.as_view(), name="api-job"),
    path("jobs/<str:job_id>/cancel", views.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<str:job_id>/events", views.JobEventsView.as_view(), name="api-job-events"),
    path("jobs/<str:job_id>/restart", views.JobRestartView.as_view(), name="api-job-restart"),
    path("jobs/<str:job_id>/metrics", views.JobMetricsView.as_view(), name="api-job-metrics"),
    path("jobs/<str:job_id>/samples", views.JobSamplesView.as_view(), name="api-job-samples"),
    path("jobs/<str:job_id>/distributions", distributions.JobDistributionView.as_view(), name="api-job-distributions"),
    path("jobs/<str:job_id>/logs", views.JobLogsView.as_view(), name="api-job-logs"),
    path("jobs/<str:job_id>/stream", job_stream, name="api-job-stream"),
    path("jobs/<str:job_id>/checkpoints", views.JobCheckpointsView.as_view(), name="api-job-checkpoints"),
    path("checkpoints/<str:checkpoint_id>/download", views.CheckpointDownloadView.as_view(), name="api-checkpoint-download"),
    path("jobs/<str:job_id>/adapters", views.JobAdaptersView.as_view(), name="api-job-adapters"),
    path("adapters/<str:adapter_id>", views.AdapterDetailView.as_view(), name="api-adapter"),
    path("adapters/<str:adapter_id>/download", views.AdapterDownloadView.as_view(), name="api-adapter-download"),
    path("models", models.ModelListView.as_view(), name="api-models"),
    path("models/<str:owner>/<str:name>", models.ModelDetailView.as_view(), name="api-model"),
    path("models/<str:owner>/<str:name>/build-log", models.ModelBuildLogView.as_view(), name="api-model-build-log"),
    path("models/<str:owner>/<str:name>/archive", views.ModelArchiveView.as_view(), name="api-model-archive"),
    path("environments", environments.EnvironmentListView.as_view(), name="api-environments"),
    path(
        "environments/<str:organization>/<str:name>",
        environments.EnvironmentDetailView.as_view(),
        name="api-environment",
    ),
    path(
        "environments/<str:organization>/<str:name>/build-log",
        environments.EnvironmentBuildLogView.as_view(),
        name="api-environment-build-log",
    ),
    path("environments/<str:organization>/<str:name>/builds", environments.EnvironmentBuildsView.as_view(), name="api-environment-builds"),
    path("prices", views.PriceListView.as_view(), name="api-prices"),
    path("schema/job-spec.json", views.JobSpecSchemaView.as_view(), name="api-job-spec-schema"),
]
