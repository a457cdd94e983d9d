"""Pushed datasets' endpoints under /api/v1 (environments.views)."""

from django.urls import path

from environments import views

urlpatterns = [
    path("datasets", views.DatasetListView.as_view(), name="api-datasets"),
    path("datasets/<str:owner>/<str:name>", views.DatasetDetailView.as_view(), name="api-dataset"),
]
