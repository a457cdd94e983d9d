"""Routes of prime CLI 0.18.0 (``prime_cli/api/rl.py``, ``training.py``, ``billing.py``, and
``commands/env.py``'s Environments Hub push and reads),
mounted at ``/prime/api/v1/`` in ``lab/urls.py``; anything else there is a JSON 404."""

from django.urls import path, re_path

from jobs.api.prime import hub, views

urlpatterns = [
    path("training/runs", views.TrainingRunCreateView.as_view(), name="prime-training-runs"),
    path("training/runs/prepare", views.TrainingRunPrepareView.as_view(), name="prime-training-run-prepare"),
    path("training/runs/<str:run_id>", views.TrainingRunDeleteView.as_view(), name="prime-training-run"),
    path("training/runs/<str:run_id>/pause", views.TrainingRunPauseView.as_view(), name="prime-training-run-pause"),
    path("training/runs/<str:run_id>/resume", views.TrainingRunResumeView.as_view(), name="prime-training-run-resume"),
    path("training/available-fft-models", views.AvailableModelsView.as_view(), name="prime-available-models"),
    path("training/available-gpu-types", views.AvailableGpuTypesView.as_view(), name="prime-available-gpu-types"),
    path("rft/runs", views.RunListView.as_view(), name="prime-runs"),
    path("rft/runs/<str:run_id>", views.RunDetailView.as_view(), name="prime-run"),
    path("rft/runs/<str:run_id>/stop", views.RunStopView.as_view(), name="prime-run-stop"),
    path("rft/runs/<str:run_id>/restart", views.RunRestartView.as_view(), name="prime-run-restart"),
    path("rft/runs/<str:run_id>/logs", views.RunLogsView.as_view(), name="prime-run-logs"),
    path("rft/runs/<str:run_id>/metrics", views.RunMetricsView.as_view(), name="prime-run-metrics"),
    path("rft/runs/<str:run_id>/samples", views.RunSamplesView.as_view(), name="prime-run-samples"),
    path("rft/runs/<str:run_id>/progress", views.RunProgressView.as_view(), name="prime-run-progress"),
    path("rft/runs/<str:run_id>/distributions", views.RunDistributionsView.as_view(), name="prime-run-distributions"),
    path("rft/runs/<str:run_id>/checkpoints", views.RunCheckpointsView.as_view(), name="prime-run-checkpoints"),
    path("billing/runs/<str:run_id>/usage", views.RunUsageView.as_view(), name="prime-run-usage"),
    path("environmentshub/", hub.HubListView.as_view(), name="prime-hub-list"),
    path("environmentshub/uploads/<str:upload_id>", hub.HubUploadView.as_view(), name="prime-hub-upload"),
    path("environmentshub/<str:owner>/<str:name>/status", hub.HubStatusView.as_view(), name="prime-hub-status"),
    path("environmentshub/<str:owner>/<str:name>/versions", hub.HubVersionsView.as_view(), name="prime-hub-versions"),
    path("environmentshub/<str:owner>/<str:name>/versions/<str:version_id>/finalize", hub.HubVersionFinalizeView.as_view(), name="prime-hub-version-finalize"),
    path("environmentshub/<str:owner>/<str:name>/wheels", hub.HubWheelsView.as_view(), name="prime-hub-wheels"),
    path("environmentshub/<str:owner>/<str:name>/wheels/<str:wheel_id>/finalize", hub.HubWheelFinalizeView.as_view(), name="prime-hub-wheel-finalize"),
    re_path(r"^environmentshub/(?P<path>.*)$", hub.HubUnsupportedView.as_view(), name="prime-hub-unsupported"),
    re_path(r"^(?P<path>.*)$", views.UnsupportedRouteView.as_view(), name="prime-unsupported"),
]
