"""Routes of Prime's sandbox API (``prime-sandboxes`` 0.5.1), mounted at ``/prime/api/v1/`` in
``lab/urls.py`` before the Prime training routes, whose catch-all answers every other path with a
JSON 404 that points to docs/prime-compat.md; other paths under ``sandbox/`` (``sandbox/status:batchGet``,
``sandbox/networks``, ...) get that 404 here, so a job's sandbox key, which
the training routes refuse, reads the same 404 (the SDK then falls back to what Lab serves)."""

from django.urls import path, re_path

from sandboxes.prime import views

_SANDBOX = r"^sandbox/(?P<sandbox_id>sbx_[0-9a-z]{1,40})"

urlpatterns = [
    path("sandbox", views.SandboxesView.as_view(), name="prime-sandboxes"),
    re_path(_SANDBOX + r"$", views.SandboxView.as_view(), name="prime-sandbox"),
    re_path(_SANDBOX + r"/auth$", views.SandboxAuthView.as_view(), name="prime-sandbox-auth"),
    re_path(_SANDBOX + r"/logs$", views.SandboxLogsView.as_view(), name="prime-sandbox-logs"),
    re_path(_SANDBOX + r"/error-context$", views.SandboxErrorContextView.as_view(), name="prime-sandbox-error-context"),
    re_path(r"^sandbox/.+$", views.UnsupportedSandboxRouteView.as_view(), name="prime-sandbox-unsupported"),
]
