"""Job and catalogue endpoints under /api/v1."""

from django.urls import path

from jobs.api import views

urlpatterns = [
    path("jobs", views.JobListView.as_view(), name="api-jobs"),
    path("jobs/estimate", views.JobEstimateView.as_view(), name="api-job-estimate"),
    path("jobs/<str:job_id>", views.JobDetailView.as_view(), name="api-job"),
    path("jobs/<str:job_id>/cancel", views.JobCancelView.as_view(), name="api-job-cancel"),
    path("jobs/<str:job_id>/events", views.JobEventsView.as_view(), name="api-job-events"),
    path("models", views.ModelListView.as_view(), name="api-models"),
    path("environments", views.EnvironmentListView.as_view(), name="api-environments"),
    path("prices", views.PriceListView.as_view(), name="api-prices"),
    path("schema/job-spec.json", views.JobSpecSchemaView.as_view(), name="api-job-spec-schema"),
]
