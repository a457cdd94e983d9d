"""Prime's sandbox shapes (``prime_sandboxes.models``) from and to Lab's: a create body becomes
Lab's, a Lab sandbox becomes Prime's ``Sandbox`` (camelCase), data-plane access becomes the
gateway auth Prime's SDK caches."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from lab.errors import FieldError, LabError
from lab.formats import iso
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime.base import WORKSPACE
from sandboxes.services import LIMITS, DataPlaneAccess

#: The ``user_ns`` of the gateway auth: the SDK reaches ``{gateway_url}/{user_ns}/{job_id}``,
#: which is the agent's ``/prime/<sandbox id>``.
GATEWAY_NAMESPACE = "prime"
#: Prime's statuses of Lab's (a stopped sandbox that reached the end of its lifetime is TIMEOUT).
STATUSES = {SandboxStatus.PENDING: "PENDING", SandboxStatus.RUNNING: "RUNNING", SandboxStatus.STOPPED: "TERMINATED",
            SandboxStatus.FAILED: "ERROR"}
#: Create fields Lab takes (each mapped below) or accepts and ignores (said in docs/prime-compat.md).
_TAKEN = {"name", "docker_image", "cpu_cores", "memory_gb", "disk_size_gb", "timeout_minutes", "environment_vars",
          "secrets", "labels", "gpu_count", "start_command"}
_IGNORED = {"team_id", "vm", "idempotency_key", "region", "arch", "idle_timeout_minutes", "advanced_configs", "guaranteed",
            "registry_credentials_id"}
_REFUSED = {
    "network_allowlist": "Lab's sandboxes have no network (network allow and deny lists are not supported).",
    "network_denylist": "Lab's sandboxes have no network (network allow and deny lists are not supported).",
    "checkpoint_id": "Lab does not checkpoint sandboxes.",
    "volumes": "Lab's sandboxes have no volumes.",
    "gpu_type": "Lab's sandboxes have no GPU.",
}


def labels_to_lab(labels: Any, param: str = "labels") -> dict[str, str]:
    """Return Lab's labels for Prime's list of strings (``"k=v"`` → ``{"k": "v"}``, ``"k"`` →
    ``{"k": ""}``); ``invalid_request`` for anything else."""
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise LabError("invalid_request", "labels must be a list of strings.", param=param)
    return dict(label.split("=", 1) if "=" in label else (label, "") for label in labels)


def create_body(data: Any) -> dict[str, Any]:
    """Return Lab's create body for Prime's ``CreateSandboxRequest`` (as its SDK sends it);
    ``invalid_request`` naming each field Lab refuses."""
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    errors = [FieldError(param=key, code="unsupported", message=message) for key, message in _REFUSED.items()
              if data.get(key) not in (None, [], "")]
    errors += [FieldError(param=key, code="unknown_field", message=f"Unknown field {key!r}.")
               for key in data if key not in _TAKEN | _IGNORED | set(_REFUSED)]
    if data.get("gpu_count") not in (None, 0):
        errors.append(FieldError(param="gpu_count", code="unsupported", message="Lab's sandboxes have no GPU."))
    if data.get("arch") not in (None, "amd64"):
        errors.append(FieldError(param="arch", code="unsupported", message="Lab's sandboxes run on amd64."))
    if errors:
        raise LabError("invalid_request", errors[0].message, errors=errors)
    environment = {**(data.get("environment_vars") or {}), **(data.get("secrets") or {})}
    body: dict[str, Any] = {
        "name": data.get("name", ""), "image": data.get("docker_image"), "cpu_cores": data.get("cpu_cores", 1.0),
        "memory_gb": data.get("memory_gb", 1.0), "disk_gb": data.get("disk_size_gb", 5.0),
        "environment": environment, "labels": labels_to_lab(data.get("labels") or []),
    }
    start_command = data.get("start_command")
    if isinstance(start_command, dict):  # StartCommand(executable, args), prime-sandboxes 0.3.0 on
        executable, arguments = start_command.get("executable"), start_command.get("args") or []
        body["start_command"] = [executable, *arguments] if isinstance(arguments, list) else start_command
    elif start_command is not None:  # a string (earlier releases): Lab runs it under /bin/sh -c
        body["start_command"] = start_command
    minutes = data.get("timeout_minutes", 60)
    if isinstance(minutes, int) and not isinstance(minutes, bool):
        # Prime's 0 or less is no lifetime (its idle timeout alone ends the sandbox, as verifiers' v1
        # runtime asks): Lab has no idle timeout, so the longest lifetime it gives.
        body["timeout_s"] = minutes * 60 if minutes > 0 else LIMITS["timeout_s"][1]
    else:
        body["timeout_s"] = minutes
    return {key: value for key, value in body.items() if value is not None}


def prime_status(sandbox: Sandbox) -> str:
    """Return Prime's status of ``sandbox``."""
    ends_at = sandbox.created_at + timedelta(seconds=sandbox.timeout_s)
    if sandbox.status == SandboxStatus.STOPPED and sandbox.stopped_at and sandbox.stopped_at >= ends_at:
        return "TIMEOUT"
    return STATUSES[SandboxStatus(sandbox.status)]


def error_context(sandbox: Sandbox) -> dict[str, Any]:
    """Return ``/sandbox/{id}/error-context``: its status and, when it failed, why."""
    status = prime_status(sandbox)
    kinds = {"ERROR": "SANDBOX_ERROR", "TIMEOUT": "TIMEOUT", "TERMINATED": "TERMINATED"}
    return {"status": status, "errorType": kinds.get(status), "errorMessage": sandbox.error or None}


def sandbox_to_prime(sandbox: Sandbox) -> dict[str, Any]:
    """Return Prime's ``Sandbox`` for ``sandbox`` (environment values are never read back)."""
    context = error_context(sandbox)
    return {
        "id": sandbox.public_id, "name": sandbox.name or sandbox.public_id, "dockerImage": sandbox.image,
        "startCommand": None, "cpuCores": sandbox.cpu_cores, "memoryGB": sandbox.memory_gb,
        "diskSizeGB": sandbox.disk_gb, "diskMountPath": WORKSPACE, "gpuCount": 0, "gpuType": None, "vm": False,
        "networkAllowlist": None, "networkDenylist": None, "status": context["status"],
        "timeoutMinutes": math.ceil(sandbox.timeout_s / 60), "idleTimeoutMinutes": None,
        "terminationReason": context["errorType"] if context["status"] != "RUNNING" else None,
        "environmentVars": None, "secrets": None, "advancedConfigs": None,
        "labels": [f"{key}={value}" if value else key for key, value in sorted(sandbox.labels.items())],
        "createdAt": iso(sandbox.created_at), "updatedAt": iso(sandbox.stopped_at or sandbox.started_at or sandbox.created_at),
        "startedAt": iso(sandbox.started_at), "terminatedAt": iso(sandbox.stopped_at), "exitCode": None,
        "errorType": context["errorType"] if context["status"] in ("ERROR", "TIMEOUT") else None,
        "errorMessage": context["errorMessage"], "userId": None, "teamId": None, "region": None,
    }


def gateway_auth(sandbox: Sandbox, access: DataPlaneAccess) -> dict[str, Any]:
    """Return the gateway auth Prime's SDK caches: it sends commands to
    ``{gateway_url}/{user_ns}/{job_id}`` with ``token`` until shortly before ``expires_at``."""
    return {"gateway_url": access.url, "user_ns": GATEWAY_NAMESPACE, "job_id": sandbox.public_id,
            "token": access.token, "expires_at": iso(access.expires_at), "sandbox_id": sandbox.public_id}
