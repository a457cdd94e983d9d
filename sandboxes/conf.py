"""Settings of the runtime that holds sandboxes (docs/kubernetes.md "Sandbox pool"): each is Django's
setting of that name when set there (tests set them so), else read from the environment once.

- ``LAB_SANDBOX_RUNTIME``: ``agent`` (default: the one agent at ``LAB_SANDBOX_AGENT_URL``) or
  ``kubernetes`` (a warm pool of agent pods, ``sandboxes.runtime.pool``).
- ``LAB_SANDBOX_POOL_NAMESPACE``: the namespace of the pool's pods (``lab-sandboxes``).
- ``LAB_SANDBOX_POOL_IMAGES``: JSON, each image to its pool's name (the pods' ``lab.dev/sandbox-pool``).
- ``LAB_SANDBOX_POOL_WAIT_S``: how long a create waits for a warm pod before it is refused (2 s).
- ``LAB_SANDBOX_POOL_DATA_PLANE_URL``: the data-plane address clients are given for a pod's
  sandbox, a template of ``{pod}``, ``{ip}`` and ``{port}`` (default: the agent's own URL,
  ``http://{ip}:{port}``, for clients inside the cluster).
- ``LAB_SANDBOX_POOL_CLUSTER``: the import path of the function that returns the pool's
  ``PodCluster`` for a namespace (Lab's cluster gateway, which lives with the launchers).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from lab.config import env_choice, env_int, env_json, env_str

_DEFAULTS = {
    "LAB_SANDBOX_RUNTIME": env_choice("LAB_SANDBOX_RUNTIME", "agent", ("agent", "kubernetes")),
    "LAB_SANDBOX_POOL_NAMESPACE": env_str("LAB_SANDBOX_POOL_NAMESPACE", "lab-sandboxes"),
    "LAB_SANDBOX_POOL_IMAGES": env_json("LAB_SANDBOX_POOL_IMAGES", {"python:3.11": "python-3-11"}),
    "LAB_SANDBOX_POOL_WAIT_S": env_int("LAB_SANDBOX_POOL_WAIT_S", 2, minimum=0, maximum=60),
    "LAB_SANDBOX_POOL_DATA_PLANE_URL": env_str("LAB_SANDBOX_POOL_DATA_PLANE_URL", "http://{ip}:{port}"),
    "LAB_SANDBOX_POOL_CLUSTER": env_str("LAB_SANDBOX_POOL_CLUSTER", "jobs.launchers.kubernetes.sandbox_pods.gateway_pods"),
}
_images = _DEFAULTS["LAB_SANDBOX_POOL_IMAGES"]
if not isinstance(_images, dict) or not all(isinstance(value, str) and value for value in _images.values()):
    raise ImproperlyConfigured('LAB_SANDBOX_POOL_IMAGES must be a JSON object like {"python:3.11": "python-3-11"}')


def setting(name: str):
    """Return the setting ``name`` (one of this module's)."""
    return getattr(settings, name, _DEFAULTS[name])


def pool_enabled() -> bool:
    """Whether sandboxes run on the Kubernetes pool."""
    return setting("LAB_SANDBOX_RUNTIME") == "kubernetes"
