"""Lab's own REST API routes under /api/v1 (docs/api.md); the apps' routes are
mounted beside them in ``lab/urls.py``."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from lab.api.views import WhoAmIView

urlpatterns = [
    path("whoami", WhoAmIView.as_view(), name="api-whoami"),
    path("schema", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="api-schema"),
]
