"""Reads of deployments (docs/serving.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from billing.models import TokenUsage
from billing.tokens import TokenTotals, token_totals_by_deployment
from jobs.deployments import DeploymentEndpoint, DeploymentUnusable
from jobs.models import Model
from serving.models import Deployment, DeploymentEvent, DeploymentStatus
from serving.serializers import openai_base_url

#: Statuses a ``model`` of the OpenAI-compatible API may name (one not yet ready answers that it is not).
CALLABLE_STATUSES = (DeploymentStatus.PENDING, DeploymentStatus.DEPLOYING, DeploymentStatus.READY)


def callable_deployment(project, name: str) -> Deployment | None:
    """Return the project's deployment that ``name`` names, with its server: the one of that name,
    else the newest serving ``<base model>:<checkpoint or adapter id>``, else the one of that id
    (``dep_...``); None when the project has none (another project's never counts), and for a
    name no database could hold."""
    if not _storable(name):
        return None
    candidates = Deployment.objects.for_project(project).filter(status__in=CALLABLE_STATUSES).select_related("server")
    found = candidates.filter(name=name).first()
    if found is None and ":" in name:
        base, _, source_id = name.rpartition(":")
        found = candidates.filter(base_model=base, source_id=source_id).order_by("-pk").first()
    if found is None and name.startswith("dep_") and len(name) <= 64:
        found = candidates.filter(public_id=name).first()
    return found


def deployment_endpoint(project, deployment_id: str) -> DeploymentEndpoint:
    """Return where a job calls the project's deployment ``deployment_id``: Lab's OpenAI-compatible
    API (``LAB_PUBLIC_URL`` + ``/api/v1/openai/v1``) under the deployment's name.

    Raises DeploymentUnusable ``unknown_deployment`` when the project has none of that id (another
    organization's reads the same), ``deployment_not_active`` when it is unloading, stopped or
    failed (a pending or deploying one is accepted: a request waits for it)."""
    deployment = deployment_get(project, deployment_id)
    if deployment is None:
        raise DeploymentUnusable("unknown_deployment", f"no deployment '{deployment_id}' in this project")
    if deployment.status not in CALLABLE_STATUSES:
        reason = f" ({deployment.status_reason})" if deployment.status_reason else ""
        raise DeploymentUnusable(
            "deployment_not_active",
            f"deployment '{deployment_id}' is {deployment.status}{reason}; only a pending, deploying or ready one can be called "
            "(deploy it again with `lab deploy`)",
        )
    return DeploymentEndpoint(base_url=openai_base_url(), model=deployment.name)


def _storable(text: str) -> bool:
    """Whether PostgreSQL can hold ``text``: no NUL character, no unpaired surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def ready_deployments(project) -> list[Deployment]:
    """Return the project's ready deployments, oldest first: what its keys may call."""
    return list(Deployment.objects.for_project(project).filter(status=DeploymentStatus.READY).order_by("pk"))


#: The newest requests whose latency a deployment's page summarizes.
LATENCY_WINDOW = 1000


@dataclass(frozen=True)
class RequestStats:
    """A deployment's requests from the token ledger: how many, their tokens and cost (micro-dollars,
    all of them), and latency percentiles in milliseconds over the newest ``LATENCY_WINDOW``
    (``duration`` to the last byte, ``first_token`` of streams to the first sampled text; each
    ``{50: ms, 95: ms, 99: ms}``, empty when none was measured)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int = 0
    duration_ms: dict[int, int] = field(default_factory=dict)
    first_token_ms: dict[int, int] = field(default_factory=dict)


def deployment_list(project, *, status: str | None = None) -> list[Deployment]:
    """Return the project's deployments, newest first (only ``status`` ones when given)."""
    deployments = Deployment.objects.for_project(project).select_related("server").order_by("-pk")
    if status is not None:
        deployments = deployments.filter(status=status)
    return list(deployments)


def model_parameters(model_id: str) -> int | None:
    """Return the parameter count the model registry holds for ``model_id`` (None when unknown)."""
    return Model.objects.filter(id=model_id).values_list("parameters", flat=True).first()


def deployment_get(project, public_id: str) -> Deployment | None:
    """Return the project's deployment ``public_id`` with its server; None when the project has
    none of that id (another project's, or a string no database could hold)."""
    if not _storable(public_id) or len(public_id) > 64:
        return None
    return Deployment.objects.for_project(project).select_related("server").filter(public_id=public_id).first()


def deployment_events(deployment: Deployment) -> list[DeploymentEvent]:
    """Return the deployment's events, oldest first."""
    return list(deployment.events.order_by("pk"))


def deployment_request_stats(deployment: Deployment) -> RequestStats:
    """Return the deployment's ``RequestStats`` (two queries)."""
    totals = token_totals_by_deployment([deployment.public_id]).get(deployment.public_id, TokenTotals())
    latest = (
        TokenUsage.objects.for_project(deployment.project_id)
        .filter(deployment_public_id=deployment.public_id)
        .order_by("-pk")
        .values_list("duration_ms", "first_token_ms")[:LATENCY_WINDOW]
    )
    durations = sorted(duration for duration, _ in latest if duration is not None)
    first_tokens = sorted(first for _, first in latest if first is not None)
    return RequestStats(
        requests=totals.requests, prompt_tokens=totals.prompt_tokens, completion_tokens=totals.completion_tokens,
        cost_micro_usd=totals.cost_micro_usd, duration_ms=percentiles(durations), first_token_ms=percentiles(first_tokens),
    )


def percentiles(ordered: list[int], points: tuple[int, ...] = (50, 95, 99)) -> dict[int, int]:
    """Return the nearest-rank percentiles ``points`` of ``ordered`` (ascending); {} when empty."""
    if not ordered:
        return {}
    return {point: ordered[max(0, math.ceil(point / 100 * len(ordered)) - 1)] for point in points}
