"""JSON shapes of deployments and their events (docs/serving.md)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings

from billing.ledger import UsageTotals, deployment_usage_totals_many
from billing.pricing import cents, micro_to_usd
from billing.tokens import TokenTotals, token_totals_by_deployment
from lab.formats import iso
from serving.models import Deployment, DeploymentEvent

#: Where the OpenAI-compatible API of this Lab answers, under its public URL.
OPENAI_PATH = "/api/v1/openai/v1"


def openai_base_url() -> str:
    """Return the ``base_url`` to give OpenAI's clients (``LAB_PUBLIC_URL`` + ``/api/v1/openai/v1``)."""
    return settings.LAB_PUBLIC_URL + OPENAI_PATH


def deployments_to_dicts(deployments: list[Deployment]) -> list[dict[str, Any]]:
    """Return the Deployment objects of ``deployments`` (their usage read in two queries: served
    tokens, and a dedicated server's compute)."""
    ids = [deployment.public_id for deployment in deployments]
    totals, compute = token_totals_by_deployment(ids), deployment_usage_totals_many(ids)
    return [
        _deployment_dict(deployment, totals.get(deployment.public_id, TokenTotals()), compute.get(deployment.public_id, NO_COMPUTE))
        for deployment in deployments
    ]


def deployment_to_dict(deployment: Deployment) -> dict[str, Any]:
    """Return the Deployment object: what it serves, its status and server, and its usage so far."""
    return deployments_to_dicts([deployment])[0]


#: The compute of a deployment that has no dedicated server's intervals.
NO_COMPUTE = UsageTotals(gpu_seconds=Decimal(0), cpu_seconds=Decimal(0), cost_micro_usd=0)


def _deployment_dict(deployment: Deployment, totals: TokenTotals, compute: UsageTotals) -> dict[str, Any]:
    server = deployment.server
    return {
        "id": deployment.public_id,
        "object": "deployment",
        "name": deployment.name,
        "status": deployment.status,
        "status_reason": deployment.status_reason or None,
        "source": {"type": deployment.source_type, "id": deployment.source_id},
        "base_model": deployment.base_model,
        "mode": deployment.mode,
        "server_status": server.status if server is not None else None,
        "openai_base_url": openai_base_url(),
        "usage": {
            "requests": totals.requests,
            "prompt_tokens": totals.prompt_tokens,
            "completion_tokens": totals.completion_tokens,
            "gpu_seconds": float(compute.gpu_seconds),
            "cpu_seconds": float(compute.cpu_seconds),
            "cost_usd": str(cents(micro_to_usd(totals.cost_micro_usd + compute.cost_micro_usd))),
        },
        "created_at": iso(deployment.created_at),
        "ready_at": iso(deployment.ready_at),
        "stopped_at": iso(deployment.stopped_at),
    }


def event_to_dict(event: DeploymentEvent) -> dict[str, Any]:
    """Return a DeploymentEvent: ``{"id", "created_at", "level", "type", "message", "data"}``."""
    return {
        "id": event.public_id, "object": "deployment_event", "created_at": iso(event.created_at), "level": event.level,
        "type": event.type, "message": event.message, "data": dict(event.data),
    }
