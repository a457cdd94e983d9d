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
# No submodule imports this package's namespace, so the table hides no import circle.
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
#: Submodules exported as they are (``lab.webhooks.verify``).
_SUBMODULES = {"webhooks": "labsdk.webhooks"}
_SOURCE = {**{name: module for module, names in _EXPORTS.items() for name in names}, **_SUBMODULES}

__all__ = sorted([*_SOURCE, "whoami"])

_RESOURCES = ("jobs", "evals", "models", "environments", "prices", "checkpoints", "adapters", "billing", "usage", "deployments")


def _export(name: str) -> Any:
    """Return the public ``name`` from its module (``_EXPORTS``), imported on first use, and keep it."""
    module = importlib.import_module(_SOURCE[name])
    value = module if name in _SUBMODULES else getattr(module, name)
    globals()[name] = value
    return value


def whoami() -> WhoAmI:
    """Return the organization, project and scopes of the default client's API key."""
    return _export("default_client")().whoami()


def __getattr__(name: str) -> Any:
    if name in _SOURCE:
        return _export(name)
    if name in _RESOURCES:
        return getattr(_export("default_client")(), name)
    raise AttributeError(f"module 'labsdk' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
