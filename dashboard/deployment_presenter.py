"""How the dashboard shows deployments (docs/serving.md): rows of the project's list, the page's
summary (what it serves, its server, its requests, tokens, cost and latency percentiles)."""

from __future__ import annotations

from dataclasses import dataclass

from billing.pricing import micro_to_usd
from lab.formats import money
from serving.models import TERMINAL_STATUSES, Deployment, DeploymentStatus
from serving.selectors import RequestStats
from serving.serializers import openai_base_url

#: The statuses the list filters by, in the order a deployment goes through them.
STATUSES = [status.value for status in DeploymentStatus]


@dataclass(frozen=True)
class DeploymentRow:
    """One deployment as the list and the page show it."""

    id: str
    name: str
    status: str
    status_reason: str
    source_type: str
    source_id: str
    base_model: str
    mode: str
    server_status: str | None
    created_at: str
    ready_at: str | None
    stopped_at: str | None
    can_chat: bool
    can_delete: bool


def deployment_row(deployment: Deployment) -> DeploymentRow:
    """Return the row of ``deployment`` (its server read already: ``select_related``)."""
    return DeploymentRow(
        id=deployment.public_id, name=deployment.name, status=deployment.status, status_reason=deployment.status_reason,
        source_type=deployment.source_type, source_id=deployment.source_id, base_model=deployment.base_model,
        mode=deployment.mode, server_status=deployment.server.status if deployment.server else None,
        created_at=_time(deployment.created_at), ready_at=_time(deployment.ready_at), stopped_at=_time(deployment.stopped_at),
        can_chat=deployment.status == DeploymentStatus.READY,
        can_delete=deployment.status not in TERMINAL_STATUSES and deployment.status != DeploymentStatus.UNLOADING,
    )


def usage_summary(stats: RequestStats) -> dict:
    """Return what the page shows of the deployment's requests: counts, tokens, cost (USD string)
    and latency percentiles as ``[(label, ms or None)]`` rows for p50, p95 and p99."""
    return {
        "requests": stats.requests,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "cost_usd": money(micro_to_usd(stats.cost_micro_usd)),
        "latency": [
            (f"p{point}", stats.duration_ms.get(point), stats.first_token_ms.get(point)) for point in (50, 95, 99)
        ],
    }


def openai_snippet(deployment: Deployment) -> str:
    """Return the Python that calls ``deployment`` with OpenAI's client (the key left to the reader)."""
    return (
        "import openai\n"
        f'client = openai.OpenAI(base_url="{openai_base_url()}", api_key="lab_...")\n'
        f'client.chat.completions.create(model="{deployment.name}", messages=[{{"role": "user", "content": "Hi"}}])'
    )


def _time(moment) -> str | None:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else None
