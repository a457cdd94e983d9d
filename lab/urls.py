"""Top-level URLs: the REST API under /api/v1 (Lab's own routes, then the jobs app's), operations
endpoints, admin and the dashboard."""

from django.contrib import admin
from django.urls import include, path

from lab import ops

urlpatterns = [
    path("api/v1/", include("lab.api.urls")),
    path("api/v1/", include("jobs.api.urls")),
    path("api/v1/", include("environments.urls")),
    path("api/v1/", include("billing.api.urls")),
    path("api/v1/", include("sandboxes.urls")),
    path("api/v1/", include("serving.urls")),
    path("api/v1/", include("evaluations.urls")),
    path("prime/api/v1/", include("sandboxes.prime.urls")),
    path("prime/api/v1/", include("evaluations.prime.urls")),
    path("prime/api/v1/", include("jobs.api.prime.urls")),
    path("billing/", include("billing.urls")),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("", include("dashboard.urls")),
]

handler404 = "dashboard.views.not_found_page"
