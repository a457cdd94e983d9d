"""OpenAPI components of the sandbox bodies (docs/sandboxes.md), as ``sandboxes/serializers.py``
builds them and ``sandboxes.services`` accepts them."""

from __future__ import annotations

from lab.api.schema import BOOLEAN, INTEGER, NUMBER, STRING, TIMESTAMP, component, list_component, nullable, obj
from sandboxes.models import NetworkPolicy, SandboxStatus
from sandboxes.services import IMAGE_ALIASES, IMAGES, LIMITS, MAX_BULK_IDS

_STRINGS = {"type": "object", "additionalProperties": STRING}


def _bounded(name: str, schema: dict) -> dict:
    minimum, maximum, default = LIMITS[name]
    return schema | {"minimum": minimum, "maximum": maximum, "default": default}


DATA_PLANE = component(
    "SandboxDataPlane",
    obj(
        {"url": STRING, "token": STRING, "expires_at": TIMESTAMP},
        description="The sandbox agent's address and a token for this sandbox alone (docs/sandboxes.md \"Data plane\").",
    ),
)
SANDBOX = component(
    "Sandbox",
    obj(
        {
            "id": STRING,
            "object": {"const": "sandbox"},
            "name": STRING,
            "status": {"type": "string", "enum": list(SandboxStatus.values)},
            "image": STRING,
            "cpu_cores": NUMBER,
            "memory_gb": NUMBER,
            "disk_gb": NUMBER,
            "timeout_s": INTEGER | {"description": "lifetime from creation, seconds"},
            "network": {"type": "string", "enum": list(NetworkPolicy.values)},
            "environment_names": {"type": "array", "items": STRING},
            "labels": _STRINGS,
            "job_id": nullable(STRING),
            "error": nullable(STRING),
            "created_at": TIMESTAMP,
            "started_at": nullable(TIMESTAMP),
            "stopped_at": nullable(TIMESTAMP),
            "warnings": {"type": "array", "items": STRING},
            "data_plane": DATA_PLANE,
        },
        optional=("warnings", "data_plane"),
        description="An isolated place where commands run (sbx_...); warnings and data_plane only on create.",
    ),
)
SANDBOX_LIST = list_component("Sandbox", "The project's sandboxes, newest first.")
SANDBOX_CREATE = component(
    "SandboxCreate",
    obj(
        {
            "name": {"type": "string", "maxLength": 100},
            "image": {"type": "string", "enum": [*IMAGES, *IMAGE_ALIASES]},
            "docker_image": {"type": "string", "enum": [*IMAGES, *IMAGE_ALIASES]},
            "cpu_cores": _bounded("cpu_cores", NUMBER),
            "memory_gb": _bounded("memory_gb", NUMBER),
            "disk_gb": _bounded("disk_gb", NUMBER),
            "timeout_s": _bounded("timeout_s", INTEGER),
            "network": {"type": "string", "enum": list(NetworkPolicy.values)},
            "environment": _STRINGS,
            "start_command": {"oneOf": [STRING, {"type": "array", "items": STRING, "minItems": 1, "maxItems": 256}],
                              "description": "A process started with the sandbox that runs as long as it does: a string "
                                             "run under /bin/sh -c, or an argv (docs/sandboxes.md)."},
            "labels": _STRINGS,
        },
        optional=("name", "image", "docker_image", "cpu_cores", "memory_gb", "disk_gb", "timeout_s", "network", "environment",
                  "start_command", "labels"),
    )
    | {"additionalProperties": False},
)
SANDBOX_BULK_DELETE = component(
    "SandboxBulkDelete",
    obj(
        {
            "ids": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 40}, "maxItems": MAX_BULK_IDS},
            "labels": _STRINGS,
        },
        optional=("ids", "labels"),
        description="The sandboxes to delete: each of ids, and each active one with every label of labels (at least one of the two).",
    )
    | {"additionalProperties": False},
)
SANDBOX_BULK_DELETE_RESULT = component(
    "SandboxBulkDeleteResult",
    obj(
        {
            "object": {"const": "sandbox.bulk_delete"},
            "deleted": {"type": "array", "items": STRING},
            "not_found": {"type": "array", "items": STRING},
        },
        description="The ids deleted (now stopped) and the ids named that the project has not (another organization's too).",
    ),
)
SANDBOX_LOGS = component(
    "SandboxLogs",
    obj(
        {"object": {"const": "sandbox.logs"}, "sandbox_id": STRING, "logs": STRING, "truncated": BOOLEAN},
        description="What the sandbox's commands printed, stdout and stderr in the order they came (the last 256 KiB; truncated when earlier output was dropped).",
    ),
)
