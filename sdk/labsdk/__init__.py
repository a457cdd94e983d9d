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

from typing import Any

from labsdk import webhooks
from labsdk._default import default_client
from labsdk._evals import Evaluation, EvaluationSample
from labsdk._version import __version__
from labsdk.client import Lab
from labsdk.errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InvalidSpecError,
    JobCancelledError,
    JobFailedError,
    LabError,
    ModelCheckFailedError,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitError,
    RequestTooLargeError,
    WaitTimeoutError,
)
from labsdk.spec import JobSpec, SpecError
from labsdk.types import (
    Adapter,
    Checkpoint,
    Distribution,
    Environment,
    EnvironmentBuild,
    Estimate,
    Job,
    JobEvent,
    LogLine,
    MetricPoint,
    Model,
    ModelBuild,
    Price,
    Sample,
    StreamEvent,
    WhoAmI,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "Adapter",
    "AuthenticationError",
    "BadRequestError",
    "Checkpoint",
    "ConflictError",
    "Distribution",
    "Environment",
    "EnvironmentBuild",
    "Estimate",
    "Evaluation",
    "EvaluationSample",
    "InvalidSpecError",
    "Job",
    "JobCancelledError",
    "JobEvent",
    "JobFailedError",
    "JobSpec",
    "Lab",
    "LabError",
    "LogLine",
    "MetricPoint",
    "Model",
    "ModelBuild",
    "ModelCheckFailedError",
    "NotFoundError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "Price",
    "RateLimitError",
    "RequestTooLargeError",
    "Sample",
    "SpecError",
    "StreamEvent",
    "WaitTimeoutError",
    "WhoAmI",
    "__version__",
    "default_client",
    "webhooks",
    "whoami",
]

_RESOURCES = ("jobs", "evals", "models", "environments", "prices", "checkpoints", "adapters", "billing", "usage", "deployments")


def whoami() -> WhoAmI:
    """Return the organization, project and scopes of the default client's API key."""
    return default_client().whoami()


def __getattr__(name: str) -> Any:
    if name in _RESOURCES:
        return getattr(default_client(), name)
    raise AttributeError(f"module 'labsdk' has no attribute {name!r}")
