"""OpenAPI components of the deployment bodies (docs/serving.md), as ``serving/serializers.py``
builds them and ``serving.services`` accepts them."""

from __future__ import annotations

from lab.api.schema import (
    FREE_OBJECT,
    INTEGER,
    MONEY,
    NUMBER,
    STRING,
    TIMESTAMP,
    component,
    list_component,
    nullable,
    obj,
)
from serving.models import DeploymentEventType, DeploymentStatus, ServerStatus, ServingMode, SourceType

_SOURCE = obj(
    {"type": {"type": "string", "enum": list(SourceType.values)}, "id": {"type": "string", "minLength": 1}},
    description="What is deployed: a ready checkpoint (ckpt_...) or adapter (adp_...) of this project, or a catalogue model id.",
)

DEPLOYMENT = component(
    "Deployment",
    obj(
        {
            "id": STRING,
            "object": {"const": "deployment"},
            "name": STRING | {"description": "what OpenAI clients send as model"},
            "status": {"type": "string", "enum": list(DeploymentStatus.values)},
            "status_reason": nullable(STRING),
            "source": _SOURCE,
            "base_model": STRING,
            "mode": {"type": "string", "enum": list(ServingMode.values)},
            "server_status": {"anyOf": [{"type": "string", "enum": list(ServerStatus.values)}, {"type": "null"}]},
            "openai_base_url": STRING,
            "usage": obj({
                "requests": INTEGER, "prompt_tokens": INTEGER, "completion_tokens": INTEGER, "gpu_seconds": NUMBER,
                "cpu_seconds": NUMBER, "cost_usd": MONEY,
            }),
            "created_at": TIMESTAMP,
            "ready_at": nullable(TIMESTAMP),
            "stopped_at": nullable(TIMESTAMP),
        },
        description="A checkpoint, adapter or model served behind the OpenAI-compatible API (dep_...).",
    ),
)
DEPLOYMENT_LIST = list_component("Deployment", "The project's deployments, newest first.")
DEPLOYMENT_CREATE = component(
    "DeploymentCreate",
    obj(
        {"source": _SOURCE | {"additionalProperties": False}, "name": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$"}},
        optional=("name",),
    )
    | {"additionalProperties": False},
)
DEPLOYMENT_EVENT = component(
    "DeploymentEvent",
    obj(
        {
            "id": STRING,
            "object": {"const": "deployment_event"},
            "created_at": TIMESTAMP,
            "level": {"type": "string", "enum": ["info", "error"]},
            "type": {"type": "string", "enum": list(DeploymentEventType.values)},
            "message": STRING,
            "data": FREE_OBJECT,
        },
        description="One status change of a deployment.",
    ),
)
DEPLOYMENT_EVENT_LIST = list_component("DeploymentEvent", "A deployment's events, oldest first.")
