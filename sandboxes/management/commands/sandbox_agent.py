"""``python manage.py sandbox_agent``: run this Lab's sandbox agent in the foreground (docs/sandboxes.md
"Data plane"), with the address of ``LAB_SANDBOX_AGENT_URL``, the secret of
``LAB_SANDBOX_AGENT_SECRET`` and the limits of the ``LAB_SANDBOX_*`` settings; its sandboxes live
under ``LAB_DATA_DIR/sandboxes``. The command replaces itself with ``python -m sandboxes.agent``,
so the agent runs without Django."""

from __future__ import annotations

import os
import sys
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run the sandbox agent (the sandboxes' data plane) with Lab's settings."

    def handle(self, *args, **options) -> None:
        address = urlsplit(settings.LAB_SANDBOX_AGENT_URL)
        argv = [
            sys.executable, "-m", "sandboxes.agent", "--root", str(settings.LAB_DATA_DIR / "sandboxes"),
            "--host", address.hostname or "127.0.0.1", "--port", str(address.port or 80),
            "--max-processes", str(settings.LAB_SANDBOX_MAX_PROCESSES),
            "--max-open-files", str(settings.LAB_SANDBOX_MAX_OPEN_FILES),
            "--warm", str(settings.LAB_SANDBOX_WARM),
        ]
        environment = {**os.environ, "LAB_SANDBOX_AGENT_SECRET": settings.LAB_SANDBOX_AGENT_SECRET}
        sys.stdout.flush()
        os.execve(sys.executable, argv, environment)
