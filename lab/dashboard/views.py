"""Dashboard views."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render

from lab.api.errors import not_found


@login_required
def home(request) -> HttpResponse:
    """The signed-in user's landing page."""
    return render(request, "dashboard/home.html", {})


def not_found_page(request, exception=None) -> HttpResponse:
    """404 for pages; the API error body for /api/ paths."""
    if request.path.startswith("/api/"):
        return JsonResponse(not_found().body(), status=404)
    return render(request, "404.html", status=404)
