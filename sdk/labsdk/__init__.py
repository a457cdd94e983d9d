"""Lab's Python SDK: the API client, job specs (:mod:`labsdk.spec`) and the ``lab`` CLI.

    import labsdk as lab
    job = lab.jobs.create(spec_file="job.toml")
    lab.jobs.wait(job.id)

The module-level ``jobs``, ``evals`` (``lab.evals.create(model=..., environments=[...])``),
``models``, ``environments``, ``prices``, ``checkpoints``,
``adapters``, ``billing``, ``usage``, ``deployments`` (``lab.deployments.create("adp_...")``), ``webhooks`` (endpoints: ``lab.webhooks.create(url)``;
and :func:`labsdk.webhooks.verify` for receiving them) and :func:`whoami` use a default
:class:`Lab` client built on first use from ``LAB_API_KEY`` and ``LAB_BASE_URL``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labsdk.types import WhoAmI

# Each public name and the module it comes from, imported when first used (PEP 562), so that a
# process needing one part (the engine reads ``labsdk.spec``) does not pay for the HTTP client.
_EXPORTS = {
    "labsdk._default": ("default_client",),
    "labsdk._evals": ("Evaluation", "EvaluationSample"),
    "labsdk._version": ("__version__",),
    "labsdk.client": ("Lab",),
    "labsdk.errors": (
        "APIConnectionError", "APIError", "AuthenticationError", "BadRequestError", "ConflictError", "InvalidSpecError",
        "JobCancelledError", "JobFailedError", "LabError", "ModelCheckFailedError", "NotFoundError",
        "PaymentRequiredError", "PermissionDeniedError", "RateLimitError", "RequestTooLargeError", "WaitTimeoutError",
    ),
    "labsdk.spec": ("JobSpec", "SpecError"),
    "labsdk.types": (
        "Adapter", "Checkpoint", "Distribution", "Environment", "EnvironmentBuild", "Estimate", "Job", "JobEvent",
        "LogLine", "MetricPoint", "Model", "ModelBuild", "Price", "Sample", "StreamEvent", "WhoAmI",
    ),
}
_SOURCE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted([*_SOURCE, "webhooks", "whoami"])

_RESOURCES = ("jobs", "evals", "models", "environments", "prices", "checkpoints", "adapters", "billing", "usage", "deployments")


def whoami() -> WhoAmI:
    """Return the organization, project and scopes of the default client's API key."""
    return importlib.import_module("labsdk._default").default_client().whoami()


def __getattr__(name: str) -> Any:
    if name in _SOURCE:
        value = getattr(importlib.import_module(_SOURCE[name]), name)
        globals()[name] = value
        return value
    if name == "webhooks":
        return importlib.import_module("labsdk.webhooks")
    if name in _RESOURCES:
        return getattr(importlib.import_module("labsdk._default").default_client(), name)
    raise AttributeError(f"module 'labsdk' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
