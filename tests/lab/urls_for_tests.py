"""A tiny tenant-owned endpoint over ApiKey rows, to test the base API class by itself."""

from django.urls import include, path
from rest_framework.response import Response

from lab.api.base import ProjectAPIView
from lab.api.pagination import paginate_by_public_id
from lab.models import ApiKey


def _serialize(api_key: ApiKey) -> dict:
    return {"id": api_key.public_id, "name": api_key.name}


class KeyListView(ProjectAPIView):
    def get(self, request):
        return Response(paginate_by_public_id(self.scoped(ApiKey.objects.all()), request.query_params, _serialize))

    def post(self, request):
        name = request.data.get("name") if isinstance(request.data, dict) else None
        api_key = ApiKey.objects.create(project=self.project, name=str(name), prefix="x", key_hash=ApiKey().public_id)
        return Response(_serialize(api_key), status=201)


class KeyDetailView(ProjectAPIView):
    def get(self, request, key_id: str):
        return Response(_serialize(self.get_owned(ApiKey.objects.all(), key_id, "key")))


urlpatterns = [
    path("api/v1/test-keys", KeyListView.as_view()),
    path("api/v1/test-keys/<str:key_id>", KeyDetailView.as_view()),
    path("", include("lab.urls")),
]
handler404 = "dashboard.views.not_found_page"
