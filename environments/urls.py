"""Pushed datasets' endpoints under /api/v1 (environments.views), and a build pod's (environments.build_views)."""

from django.urls import path

from environments import build_views, views

urlpatterns = [
    path("datasets", views.DatasetListView.as_view(), name="api-datasets"),
    path("datasets/<str:owner>/<str:name>", views.DatasetDetailView.as_view(), name="api-dataset"),
    # A build's pod on the Kubernetes pool (environments.build_views), with its build's token.
    path("environment-builds/<int:build_id>/wheel", build_views.BuildWheelView.as_view(), name="build-wheel"),
    path("environment-builds/<int:build_id>/datasets", build_views.BuildDatasetsView.as_view(), name="build-datasets"),
    path("environment-builds/<int:build_id>/wheelhouse/<str:sha256>/<str:filename>", build_views.BuildWheelhouseView.as_view(),
         name="build-wheelhouse"),
    path("environment-builds/<int:build_id>/hub-datasets/<str:sha256>", build_views.BuildHubDatasetsView.as_view(),
         name="build-hub-datasets"),
    path("environment-builds/<int:build_id>/log", build_views.BuildLogView.as_view(), name="build-log"),
    path("environment-builds/<int:build_id>/result", build_views.BuildResultView.as_view(), name="build-result"),
]
