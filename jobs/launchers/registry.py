"""The launcher this Lab is configured with (``LAB_LAUNCHER``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobs.launchers.base import Launcher
from jobs.launchers.local import LocalLauncher


@cache
def _launcher(kind: str, data_dir: str) -> Launcher:
    if kind == "local":
        return LocalLauncher(runs_dir=Path(data_dir) / "runs", repo_dir=Path(settings.BASE_DIR))
    raise ImproperlyConfigured(f"LAB_LAUNCHER={kind!r} is not available in this build")


def get_launcher() -> Launcher:
    """Return the configured launcher."""
    return _launcher(settings.LAB_LAUNCHER, str(settings.LAB_DATA_DIR))
