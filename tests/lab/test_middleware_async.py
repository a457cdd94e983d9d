"""Under ASGI every middleware runs in the event loop: none is sync only, which would make Django
adapt the async handler and run each async view (the live stream, the OpenAI-compatible API)
through a thread and back; static files are still served as WhiteNoise serves them."""

from __future__ import annotations

from django.conf import settings
from django.test import Client
from django.utils.module_loading import import_string


def test_every_middleware_runs_async():
    # Django's own rule (django.core.handlers.base.BaseHandler.load_middleware): no async_capable, sync only.
    sync_only = [path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []


def test_static_files_are_served_with_their_cache_headers():
    response = Client().get("/static/css/lab.css")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/css")
    assert "max-age" in response["Cache-Control"]
