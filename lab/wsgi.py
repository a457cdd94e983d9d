"""WSGI entry point, for servers without ASGI (the live stream needs ASGI)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lab.settings")

application = get_wsgi_application()
