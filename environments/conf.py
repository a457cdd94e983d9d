"""The environments app's own settings (lab/settings.py holds Lab-wide ones), each read from
Django's settings when set there (tests override them so), else from its variable:

- ``LAB_K8S_BUILD_NAMESPACE`` (``lab-builds``): where builds run as Jobs on the Kubernetes pool;
- ``LAB_K8S_BUILD_CPU`` (2 cores) and ``LAB_K8S_BUILD_MEMORY_GIB`` (8): the builder container's
  requests, its memory also its limit (a build past it is OOM-killed and fails saying so).
"""

from __future__ import annotations

from django.conf import settings

from lab.config import env_int, env_str

_DEFAULTS = {
    "LAB_K8S_BUILD_NAMESPACE": lambda: env_str("LAB_K8S_BUILD_NAMESPACE", "lab-builds"),
    "LAB_K8S_BUILD_CPU": lambda: env_int("LAB_K8S_BUILD_CPU", 2, minimum=1),
    "LAB_K8S_BUILD_MEMORY_GIB": lambda: env_int("LAB_K8S_BUILD_MEMORY_GIB", 8, minimum=1),
}


def setting(name: str):
    """The value of the environments setting ``name`` (one of ``_DEFAULTS``)."""
    return getattr(settings, name) if hasattr(settings, name) else _DEFAULTS[name]()
