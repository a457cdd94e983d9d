"""ASGI entry point: ``uvicorn lab.asgi:application``."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

application = get_asgi_application()
