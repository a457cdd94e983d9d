"""The deployments a job spec may name as an endpoint (``[teacher] deployment``, ``[[env]] judge``).

Deployments belong to ``serving``, which sits above ``jobs``: the composition root names
serving's lookup in ``settings.LAB_DEPLOYMENT_ENDPOINT`` (a dotted path to a function
``(project, deployment_id) -> DeploymentEndpoint``), and jobs asks through
:func:`deployment_endpoint` without importing serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from lab.models import Project


@dataclass(frozen=True)
class DeploymentEndpoint:
    """Where a deployment is called: Lab's OpenAI-compatible API (``base_url``, ending ``/v1``)
    under the deployment's name (``model``)."""

    base_url: str
    model: str


class DeploymentUnusable(Exception):
    """A deployment a spec names cannot be called: ``code`` ``unknown_deployment`` (missing, or
    another organization's: the same answer) or ``deployment_not_active`` (stopping, stopped or
    failed); ``str()`` says which for the user."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def deployment_endpoint(*, project: Project, deployment_id: str) -> DeploymentEndpoint:
    """Return the endpoint of the project's deployment ``deployment_id`` (``dep_...``).

    Raises DeploymentUnusable when it is missing, another project's, or no longer active; and,
    as for a missing one, when this Lab names no lookup (``LAB_DEPLOYMENT_ENDPOINT`` empty)."""
    path = getattr(settings, "LAB_DEPLOYMENT_ENDPOINT", "")
    if not path:
        raise DeploymentUnusable("unknown_deployment", f"no deployment '{deployment_id}' in this project")
    return import_string(path)(project, deployment_id)
