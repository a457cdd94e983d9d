"""Sandbox services: create (within the organization's cap), read, delete, run a command, move
files, and reap sandboxes past their lifetime (docs/sandboxes.md).

Each write runs in one short transaction; the runtime (a process, a folder) is only called
outside it. Refusals are ``lab.errors.LabError``: ``invalid_request`` (the field as ``param``),
``invalid_state`` (the sandbox is not running), ``rate_limited`` (the organization's cap on
concurrent sandboxes), ``not_found``.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from lab.audit import Actor, AuditAction, audit_record
from lab.errors import FieldError, LabError
from lab.models import Organization, Project
from sandboxes.models import ACTIVE_STATUSES, NetworkPolicy, Sandbox, SandboxStatus
from sandboxes.runtime.base import CommandRequest, CommandResult, RuntimeRefusal, SandboxRuntime, SandboxSpec
from sandboxes.runtime.local import LocalRuntime

#: Images the local runtime knows: ``python:3.11`` is the host's /usr with its system Python.
IMAGES = ("python:3.11",)
#: Names clients use (Docker Hub's) that map to one of ours, with a warning.
IMAGE_ALIASES = {"python:3.11-slim": "python:3.11", "python:3.11-bookworm": "python:3.11"}
#: Bounds of a sandbox's resources (cores, GB, seconds) and of a command's timeout (seconds).
LIMITS = {
    "cpu_cores": (0.25, 8.0, 1.0),
    "memory_gb": (0.125, 16.0, 1.0),
    "disk_gb": (0.01, 20.0, 1.0),
    "timeout_s": (1, 86_400, 3600),
}
COMMAND_TIMEOUT_S = (1, 3600, 60)
#: Variables and labels: names like shell variables and label keys like Kubernetes' (≤ 63 chars).
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-/]{0,61}[A-Za-z0-9])?$")
_MAX_VARIABLES = 100
_MAX_LABELS = 32
#: The largest file a download answers (bytes); uploads are bounded by the request body limit.
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024


@functools.cache
def runtime() -> SandboxRuntime:
    """Return the runtime that holds this Lab's sandboxes (the local one under ``LAB_DATA_DIR``)."""
    return LocalRuntime(
        settings.LAB_DATA_DIR / "sandboxes",
        max_processes=settings.LAB_SANDBOX_MAX_PROCESSES,
        max_open_files=settings.LAB_SANDBOX_MAX_OPEN_FILES,
    )


def sandbox_spec(sandbox: Sandbox) -> SandboxSpec:
    """Return what the runtime needs of ``sandbox``."""
    return SandboxSpec(
        sandbox_id=sandbox.public_id,
        image=sandbox.image,
        cpu_cores=sandbox.cpu_cores,
        memory_gb=sandbox.memory_gb,
        disk_gb=sandbox.disk_gb,
        network=sandbox.network,
        environment=dict(sandbox.environment),
        slot=sandbox.pk,
    )


# --- parsing -------------------------------------------------------------------------------------


@dataclass
class _Problems:
    errors: list[FieldError] = field(default_factory=list)

    def add(self, param: str, code: str, message: str) -> None:
        self.errors.append(FieldError(param=param, code=code, message=message))

    def raise_any(self) -> None:
        if self.errors:
            raise LabError("invalid_request", self.errors[0].message, errors=self.errors)


def _number(data: dict, name: str, problems: _Problems, *, integer: bool = False) -> float | int | None:
    minimum, maximum, default = LIMITS[name]
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        problems.add(name, "invalid", f"{name} must be a {'whole ' if integer else ''}number.")
        return None
    if not (minimum <= value <= maximum) or not math.isfinite(value):
        problems.add(name, "out_of_range", f"{name} must be from {minimum} to {maximum}.")
        return None
    return int(value) if integer else float(value)


def _variables(value: Any, param: str, problems: _Problems) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_VARIABLES:
        problems.add(param, "invalid", f"{param} must be an object of at most {_MAX_VARIABLES} string variables.")
        return {}
    for name, item in value.items():
        if not _VARIABLE.match(name) or not isinstance(item, str) or "\x00" in item or len(item) > 32_768:
            problems.add(f"{param}.{name}", "invalid", "A variable needs a shell-style name and a string value.")
    return dict(value)


def _labels(value: Any, problems: _Problems) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_LABELS:
        problems.add("labels", "invalid", f"labels must be an object of at most {_MAX_LABELS} string labels.")
        return {}
    for key, item in value.items():
        if not _LABEL_KEY.match(key) or not isinstance(item, str) or len(item) > 63 or "\x00" in item:
            problems.add(f"labels.{key}", "invalid", "A label needs a short key and a string value of at most 63 characters.")
    return dict(value)


def _image(value: Any, problems: _Problems, warnings: list[str]) -> str:
    if value in IMAGES:
        return value
    if value in IMAGE_ALIASES:
        image = IMAGE_ALIASES[value]
        warnings.append(f"image {value!r} runs as {image!r}, the Python 3.11 image this Lab provides.")
        return image
    problems.add("image", "unknown_image", f"image must be one of {', '.join((*IMAGES, *IMAGE_ALIASES))}.")
    return ""


_CREATE_FIELDS = {"name", "image", "docker_image", "cpu_cores", "memory_gb", "disk_gb", "timeout_s", "network", "environment", "labels"}


@dataclass(frozen=True)
class SandboxCreate:
    """A valid create body, and the warnings it earned (an image alias)."""

    fields: dict[str, Any]
    warnings: list[str]


def parse_sandbox_create(data: Any) -> SandboxCreate:
    """Return the fields of a create body (docs/sandboxes.md), or raise ``invalid_request``
    naming every bad field."""
    problems = _Problems()
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    for key in data:
        if key not in _CREATE_FIELDS:
            problems.add(key, "unknown_field", f"Unknown field {key!r}.")
    warnings: list[str] = []
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 100 or "\x00" in name:
        problems.add("name", "invalid", "name must be a string of at most 100 characters.")
    network = data.get("network", NetworkPolicy.NONE)
    if network not in NetworkPolicy.values:
        problems.add("network", "invalid", f"network must be one of {', '.join(NetworkPolicy.values)}.")
    elif network == NetworkPolicy.EGRESS and not settings.LAB_SANDBOX_ALLOW_EGRESS:
        problems.add("network", "egress_not_allowed", "This Lab runs sandboxes without a network (LAB_SANDBOX_ALLOW_EGRESS).")
    fields = {
        "name": name,
        "image": _image(data.get("image", data.get("docker_image", IMAGES[0])), problems, warnings),
        "cpu_cores": _number(data, "cpu_cores", problems),
        "memory_gb": _number(data, "memory_gb", problems),
        "disk_gb": _number(data, "disk_gb", problems),
        "timeout_s": _number(data, "timeout_s", problems, integer=True),
        "network": network,
        "environment": _variables(data.get("environment"), "environment", problems),
        "labels": _labels(data.get("labels"), problems),
    }
    problems.raise_any()
    return SandboxCreate(fields=fields, warnings=warnings)


# --- control plane -------------------------------------------------------------------------------


def sandbox_create(*, project: Project, actor: Actor, data: Any) -> tuple[Sandbox, list[str]]:
    """Create a sandbox from a request body and start it; return it (``running``, or ``failed``
    with its ``error`` when the runtime could not start it) and the body's warnings.

    The organization's row is locked while its active sandboxes are counted, so concurrent
    creates cannot pass ``LAB_SANDBOX_MAX_PER_ORG`` together (``rate_limited`` past it).
    """
    parsed = parse_sandbox_create(data)
    with transaction.atomic():
        Organization.objects.select_for_update().filter(pk=project.organization_id).first()
        active = Sandbox.objects.unscoped().filter(organization_id=project.organization_id, status__in=ACTIVE_STATUSES)
        cap = settings.LAB_SANDBOX_MAX_PER_ORG
        if active.count() >= cap:
            raise LabError(
                "rate_limited", f"The organization already runs {cap} sandboxes (its cap); delete one first.",
                retry_after_s=_seconds_until_one_ends(active),
            )
        sandbox = Sandbox.objects.create(
            organization_id=project.organization_id,
            project=project,
            created_by=actor.user or (actor.api_key.created_by if actor.api_key else None),
            created_by_key=actor.api_key,
            **parsed.fields,
        )
        audit_record(
            actor=actor, organization=project.organization, project=project, action=AuditAction.SANDBOX_CREATE,
            target=sandbox.public_id, data={"image": sandbox.image, "network": sandbox.network},
        )
    try:
        runtime().start(sandbox_spec(sandbox))
    except OSError as error:
        _finish(sandbox, SandboxStatus.FAILED, error=f"The runtime could not start the sandbox: {error.strerror}")
        return sandbox, parsed.warnings
    updated = Sandbox.objects.unscoped().filter(pk=sandbox.pk, status=SandboxStatus.PENDING).update(
        status=SandboxStatus.RUNNING, started_at=timezone.now()
    )
    sandbox.refresh_from_db()
    if not updated:  # deleted meanwhile: its folder must not outlive it
        runtime().destroy(sandbox_spec(sandbox))
    return sandbox, parsed.warnings


def _seconds_until_one_ends(active) -> int:
    """Return the seconds until the first of ``active`` sandboxes reaches the end of its lifetime
    (at least 1): when a create refused at the cap may pass without anyone deleting one."""
    now = timezone.now()
    ends = [created + timedelta(seconds=timeout) for created, timeout in active.values_list("created_at", "timeout_s")]
    return max(1, math.ceil((min(ends) - now).total_seconds())) if ends else 1


def sandbox_list(*, project: Project, labels: dict[str, str] | None = None):
    """Return the project's sandboxes (a queryset, for cursor paging), those carrying every label
    of ``labels`` when given."""
    sandboxes = Sandbox.objects.for_project(project)
    for key, value in (labels or {}).items():
        sandboxes = sandboxes.filter(labels__contains={key: value})
    return sandboxes


def sandbox_delete(*, sandbox: Sandbox, actor: Actor) -> Sandbox:
    """Stop ``sandbox`` and delete its files; the row stays, ``stopped`` (idempotent)."""
    with transaction.atomic():
        audit_record(
            actor=actor, organization=sandbox.project.organization, project=sandbox.project,
            action=AuditAction.SANDBOX_DELETE, target=sandbox.public_id,
        )
    return _finish(sandbox, SandboxStatus.STOPPED)


def _finish(sandbox: Sandbox, status: SandboxStatus, *, error: str = "") -> Sandbox:
    """Move an active ``sandbox`` to ``status`` (a conditional UPDATE: once), then delete its files."""
    Sandbox.objects.unscoped().filter(pk=sandbox.pk, status__in=ACTIVE_STATUSES).update(
        status=status, stopped_at=timezone.now(), error=error[:500]
    )
    runtime().destroy(sandbox_spec(sandbox))
    sandbox.refresh_from_db()
    return sandbox


def sandbox_reap_expired(*, now: datetime | None = None) -> int:
    """Stop every active sandbox past its lifetime (``created_at + timeout_s``) and delete its
    files; return how many. Safe to run concurrently: each is stopped by a conditional UPDATE."""
    now = now or timezone.now()
    reaped = 0
    for sandbox in Sandbox.objects.unscoped().filter(status__in=ACTIVE_STATUSES).order_by("pk"):
        if sandbox.created_at + timedelta(seconds=sandbox.timeout_s) <= now:
            _finish(sandbox, SandboxStatus.STOPPED)
            reaped += 1
    return reaped


# --- data plane ----------------------------------------------------------------------------------


def _require_running(sandbox: Sandbox, *, now: datetime) -> float:
    """Return the seconds left of ``sandbox``'s lifetime; ``invalid_state`` unless it is running."""
    left = (sandbox.created_at + timedelta(seconds=sandbox.timeout_s) - now).total_seconds()
    if sandbox.status != SandboxStatus.RUNNING or left <= 0:
        raise LabError("invalid_state", f"The sandbox is {sandbox.status if left > 0 else 'past its lifetime'}.")
    return left


def _refusal(error: RuntimeRefusal, param: str) -> LabError:
    if error.code == "file_not_found":
        return LabError("not_found", error.message)
    if error.code in ("disk_quota_exceeded", "file_too_large"):
        return LabError("invalid_state", error.message)
    return LabError("invalid_request", error.message, errors=[FieldError(param=param, code=error.code, message=error.message)])


def sandbox_run_command(*, sandbox: Sandbox, data: Any) -> CommandResult:
    """Run the command of a body ``{"command": str | [str], "timeout_s", "cwd", "env"}`` and wait
    for it (a string runs under ``/bin/sh -c``). The timeout (default 60 s) is cut to the
    sandbox's remaining lifetime. Raises ``invalid_request`` or ``invalid_state``."""
    left = _require_running(sandbox, now=timezone.now())
    problems = _Problems()
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    for key in data:
        if key not in ("command", "timeout_s", "cwd", "env"):
            problems.add(key, "unknown_field", f"Unknown field {key!r}.")
    command = data.get("command")
    if isinstance(command, str) and command and "\x00" not in command:
        argv: tuple[str, ...] = ("/bin/sh", "-c", command)
    elif isinstance(command, list) and command and all(isinstance(a, str) and "\x00" not in a for a in command):
        argv = tuple(command)
    else:
        argv = ()
        problems.add("command", "invalid", "command must be a non-empty string or list of strings.")
    minimum, maximum, default = COMMAND_TIMEOUT_S
    timeout = data.get("timeout_s", default)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not minimum <= timeout <= maximum:
        problems.add("timeout_s", "out_of_range", f"timeout_s must be a number from {minimum} to {maximum}.")
    cwd = data.get("cwd") or "/workspace"
    if not isinstance(cwd, str):
        problems.add("cwd", "invalid", "cwd must be a path in /workspace.")
    environment = _variables(data.get("env"), "env", problems)
    problems.raise_any()
    request = CommandRequest(argv=argv, timeout_s=min(float(timeout), left), cwd=cwd, environment=environment)
    try:
        return runtime().run(sandbox_spec(sandbox), request)
    except RuntimeRefusal as error:
        raise _refusal(error, "cwd") from None


def sandbox_write_file(*, sandbox: Sandbox, path: str, data: bytes) -> str:
    """Write ``data`` at ``path`` in the sandbox's /workspace; return the absolute path inside.
    Raises ``invalid_request`` (a path outside /workspace, ``..``, a symlink), ``invalid_state``."""
    _require_running(sandbox, now=timezone.now())
    try:
        return runtime().write_file(sandbox_spec(sandbox), path, data)
    except RuntimeRefusal as error:
        raise _refusal(error, "path") from None


def sandbox_read_file(*, sandbox: Sandbox, path: str) -> bytes:
    """Return the file at ``path`` in the sandbox's /workspace. Raises ``invalid_request``,
    ``not_found`` (no such file), ``invalid_state``."""
    _require_running(sandbox, now=timezone.now())
    try:
        return runtime().read_file(sandbox_spec(sandbox), path, max_bytes=MAX_DOWNLOAD_BYTES)
    except RuntimeRefusal as error:
        raise _refusal(error, "path") from None
