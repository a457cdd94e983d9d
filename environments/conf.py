"""The environments app's own settings (lab/settings.py holds Lab-wide ones), each read from
Django's settings when set there (tests override them so), else from its variable:

- ``LAB_K8S_BUILD_NAMESPACE`` (``lab-builds``): where builds run as Jobs on the Kubernetes pool;
- ``LAB_K8S_BUILD_CPU`` (2 cores) and ``LAB_K8S_BUILD_MEMORY_GIB`` (8): the builder container's
  requests, its memory also its limit (a build past it is OOM-killed and fails saying so);
- ``LAB_K8S_BUILD_EGRESS`` (none): NetworkPolicy egress rules (JSON, as ``LAB_K8S_ENGINE_EGRESS``)
  a build's pod is given besides the cluster DNS, public addresses and what engine pods reach:
  a package index or Hub mirror on a private address.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from lab.config import env_int, env_json, env_str

_DEFAULTS = {
    "LAB_K8S_BUILD_NAMESPACE": lambda: env_str("LAB_K8S_BUILD_NAMESPACE", "lab-builds"),
    "LAB_K8S_BUILD_CPU": lambda: env_int("LAB_K8S_BUILD_CPU", 2, minimum=1),
    "LAB_K8S_BUILD_MEMORY_GIB": lambda: env_int("LAB_K8S_BUILD_MEMORY_GIB", 8, minimum=1),
    "LAB_K8S_BUILD_EGRESS": lambda: _egress_rules("LAB_K8S_BUILD_EGRESS"),
}


def _egress_rules(name: str) -> list[dict]:
    """The NetworkPolicy egress rules of ``name`` (a JSON list of objects with a non-empty ``to``
    and/or ``ports``; an empty rule would allow everything and is refused)."""
    rules = env_json(name, [])
    if not isinstance(rules, list) or not all(
        isinstance(rule, dict) and rule and set(rule) <= {"to", "ports"} and all(isinstance(rule[key], list) and rule[key] for key in rule)
        for rule in rules
    ):
        raise ImproperlyConfigured(f'{name} must be a JSON list of NetworkPolicy egress rules, each with a non-empty "to" and/or "ports"')
    return rules


def setting(name: str):
    """The value of the environments setting ``name`` (one of ``_DEFAULTS``)."""
    return getattr(settings, name) if hasattr(settings, name) else _DEFAULTS[name]()
