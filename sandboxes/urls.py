"""Sandbox routes under /api/v1 (docs/sandboxes.md)."""

from django.urls import path

from sandboxes import views

urlpatterns = [
    path("sandboxes", views.SandboxListView.as_view(), name="api-sandboxes"),
    path("sandboxes/bulk-delete", views.SandboxBulkDeleteView.as_view(), name="api-sandboxes-bulk-delete"),
    path("sandboxes/<str:sandbox_id>", views.SandboxDetailView.as_view(), name="api-sandbox"),
    path("sandboxes/<str:sandbox_id>/auth", views.SandboxAuthView.as_view(), name="api-sandbox-auth"),
    path("sandboxes/<str:sandbox_id>/logs", views.SandboxLogsView.as_view(), name="api-sandbox-logs"),
]
