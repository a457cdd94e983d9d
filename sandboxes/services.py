"""Sandbox services: create (within the organization's cap), read, delete (one, or many by ids
and labels; what they printed is kept, ``sandboxes.kept_logs``, and read in ``sandboxes.logs``), hand out data-plane access, reap sandboxes past their lifetime, and end the sandboxes of a job's attempt (what
decides that an attempt may create one or has ended is the job pipeline's: ``jobs.sandboxes``;
docs/sandboxes.md "Sandboxes of a job").

Each write runs in one short transaction; the runtime (the sandbox agent) is only called outside
it. Commands and files never pass through here: clients take a token from ``sandbox_access``
to the agent's data plane. Refusals are ``lab.errors.LabError``: ``invalid_request`` (the field
as ``param``), ``invalid_state`` (the sandbox is not running), ``rate_limited`` (the
organization's cap on concurrent sandboxes), ``insufficient_credit``, ``spend_limit_reached``
or ``payment_failed`` (billing on and nothing of the organization can run, as for jobs),
``not_found``, ``sandbox_capacity`` (no warm pod on the Kubernetes pool). Usage goes to the
billing ledger through ``sandboxes.usage``; which agent holds a sandbox, ``sandboxes.placement``.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from billing.accounts import BLOCKER_MESSAGES, organization_run_blocker
from lab.audit import Actor, AuditAction, audit_record
from lab.errors import FieldError, LabError, not_found
from lab.ids import public_id
from lab.models import Organization, Project
from sandboxes import placement
from sandboxes.kept_logs import keep_log
from sandboxes.labels import LABEL_KEY, with_labels
from sandboxes.models import ACTIVE_STATUSES, NetworkPolicy, Sandbox, SandboxStatus
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import RuntimeRefusal, SandboxSpec
from sandboxes.usage import sandbox_usage_close

logger = logging.getLogger(__name__)

#: Images the local runtime knows (``sandboxes.images``: Debian's Python 3.11 built by make sandbox-images).
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
#: Variables: names like shell variables (label keys: sandboxes.labels).
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_MAX_VARIABLES = 100
#: A start command's bounds: arguments, and characters in all (verifiers 0.3.0's PythonEnv sends 3,572).
_MAX_START_ARGUMENTS = 256
_MAX_START_COMMAND_CHARACTERS = 128 * 1024
_MAX_LABELS = 32
#: The labels Lab gives the sandboxes of a job's attempt: the job's public id and the attempt's number.
JOB_LABEL = "lab.job"
ATTEMPT_LABEL = "lab.attempt"


def runtime() -> AgentRuntime:
    """Return the one agent at ``LAB_SANDBOX_AGENT_URL`` (``LAB_SANDBOX_RUNTIME=agent``)."""
    return placement.agent_at(settings.LAB_SANDBOX_AGENT_URL)


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
        expires_at=sandbox_ends_at(sandbox).timestamp(),
    )


def sandbox_ends_at(sandbox: Sandbox) -> datetime:
    """Return when ``sandbox``'s lifetime ends."""
    return sandbox.created_at + timedelta(seconds=sandbox.timeout_s)


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


def _start_command(value: Any, problems: _Problems) -> list[str]:
    """Return a start command's argv: a list of strings as it is, a string run under ``/bin/sh -c``
    (as commands are)."""
    if value is None or value == [] or value == "":
        return []
    argv = ["/bin/sh", "-c", value] if isinstance(value, str) else value
    if (not isinstance(argv, list) or not argv or len(argv) > _MAX_START_ARGUMENTS
            or not all(isinstance(item, str) and "\x00" not in item for item in argv)
            or sum(len(item) for item in argv) > _MAX_START_COMMAND_CHARACTERS):
        problems.add("start_command", "invalid",
                     f"start_command must be a string or a list of at most {_MAX_START_ARGUMENTS} strings, "
                     f"{_MAX_START_COMMAND_CHARACTERS} characters in all, without NUL bytes.")
        return []
    return list(argv)


def _labels(value: Any, problems: _Problems) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_LABELS:
        problems.add("labels", "invalid", f"labels must be an object of at most {_MAX_LABELS} string labels.")
        return {}
    for key, item in value.items():
        if not LABEL_KEY.match(key) or not isinstance(item, str) or len(item) > 63 or "\x00" in item:
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


_CREATE_FIELDS = {"name", "image", "docker_image", "cpu_cores", "memory_gb", "disk_gb", "timeout_s", "network", "environment",
                  "start_command", "labels"}


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
        "start_command": _start_command(data.get("start_command"), problems),
        "labels": _labels(data.get("labels"), problems),
    }
    problems.raise_any()
    return SandboxCreate(fields=fields, warnings=warnings)


# --- control plane -------------------------------------------------------------------------------


def sandbox_create(
    *, project: Project, actor: Actor, data: Any, attempt: Model | None = None
) -> tuple[Sandbox, list[str]]:
    """Create a sandbox from a request body and start it; return it (``running``, or ``failed``
    with its ``error`` when the runtime could not start it) and the body's warnings.

    The organization's row is locked while its active sandboxes are counted, so concurrent
    creates cannot pass ``LAB_SANDBOX_MAX_PER_ORG`` together (``rate_limited`` past it). Billing
    on, nothing is created when nothing of the organization can run (``organization_run_blocker``:
    ``insufficient_credit``, ``spend_limit_reached`` or ``payment_failed``, with the jobs' messages).
    With ``attempt`` (a ``jobs.JobAttempt``, its job loaded) the sandbox belongs to that job attempt
    (``jobs.sandboxes.sandbox_create_for_attempt``) and carries the labels ``lab.job`` and ``lab.attempt``.
    A ``start_command`` is handed to the runtime, which starts it with the sandbox; it is not stored.
    """
    parsed = parse_sandbox_create(data)
    start_command = tuple(parsed.fields.pop("start_command"))  # given to the runtime at start, not stored
    blocker = organization_run_blocker(project.organization_id)
    if blocker:
        raise LabError(blocker, BLOCKER_MESSAGES[blocker])
    if attempt is not None:
        parsed.fields["labels"].update({JOB_LABEL: attempt.job.public_id, ATTEMPT_LABEL: str(attempt.number)})
    _refuse_over_cap(project.organization_id)  # unlocked, first: no pool pod is spent on a create it refuses
    # A pool's pod is claimed before the row: no warm pod refuses the create, changing nothing.
    sizes = {name: parsed.fields[name] for name in ("image", "cpu_cores", "memory_gb", "disk_gb", "network")}
    pod = placement.claim_for(SandboxSpec(sandbox_id=(sandbox_id := public_id("sbx")), **sizes))
    with placement.released_on_error(pod), transaction.atomic():
        Organization.objects.select_for_update().filter(pk=project.organization_id).first()
        _refuse_over_cap(project.organization_id)
        sandbox = Sandbox.objects.create(
            public_id=sandbox_id,
            organization_id=project.organization_id,
            project=project,
            created_by=actor.user or (actor.api_key.created_by if actor.api_key else None),
            created_by_key=actor.api_key,
            attempt=attempt,
            **placement.pod_fields(pod),
            **parsed.fields,
        )
        audit_record(
            actor=actor, organization=project.organization, project=project, action=AuditAction.SANDBOX_CREATE,
            target=sandbox.public_id,
            data={"image": sandbox.image, "network": sandbox.network, **({"pod": pod.name} if pod else {}),
                  **({"job": attempt.job.public_id, "attempt": attempt.number} if attempt else {})},
        )
    try:
        placement.agent_of(sandbox).start(replace(sandbox_spec(sandbox), start_command=start_command))
    except RuntimeRefusal as error:
        _finish(sandbox, SandboxStatus.FAILED, error=f"The runtime could not start the sandbox: {error.message}", keep=False)
        return sandbox, parsed.warnings
    updated = Sandbox.objects.unscoped().filter(pk=sandbox.pk, status=SandboxStatus.PENDING).update(
        status=SandboxStatus.RUNNING, started_at=timezone.now()
    )
    sandbox.refresh_from_db()
    if not updated:  # deleted meanwhile: its folder must not outlive it
        placement.agent_of(sandbox).destroy(sandbox_spec(sandbox))
    return sandbox, parsed.warnings


def _refuse_over_cap(organization_id: int) -> None:
    """Raise ``rate_limited`` when the organization runs ``LAB_SANDBOX_MAX_PER_ORG`` sandboxes, its
    ``retry_after_s`` the seconds until the first of them reaches the end of its lifetime (at
    least 1): when a create refused at the cap may pass without anyone deleting one."""
    active = Sandbox.objects.unscoped().filter(organization_id=organization_id, status__in=ACTIVE_STATUSES)
    if active.count() < (cap := settings.LAB_SANDBOX_MAX_PER_ORG):
        return
    ends = [created + timedelta(seconds=timeout) for created, timeout in active.values_list("created_at", "timeout_s")]
    retry_after_s = max(1, math.ceil((min(ends) - timezone.now()).total_seconds())) if ends else 1
    raise LabError("rate_limited", f"The organization already runs {cap} sandboxes (its cap); delete one first.", retry_after_s=retry_after_s)


def sandbox_of_attempt(*, attempt_id: int, sandbox_id: str) -> Sandbox:
    """Return the sandbox ``sandbox_id`` made by the job attempt ``attempt_id``; ``not_found`` for any other."""
    sandbox = Sandbox.objects.unscoped().filter(attempt_id=attempt_id, public_id=sandbox_id).select_related("project__organization").first()
    if sandbox is None:
        raise not_found("sandbox")
    return sandbox


def sandbox_end_for_attempt(*, attempt_id: int) -> int:
    """Delete every active sandbox of the attempt ``attempt_id`` (``sandbox_delete`` by the system);
    return how many. The job pipeline calls it once an attempt has ended, however it ended."""
    active = Sandbox.objects.unscoped().filter(attempt_id=attempt_id, status__in=ACTIVE_STATUSES)
    ended = 0
    for sandbox in active.select_related("project__organization").order_by("pk"):
        sandbox_delete(sandbox=sandbox, actor=Actor.system())
        ended += 1
    return ended


def sandbox_list(*, project: Project, labels: dict[str, str] | None = None, attempt_id: int | None = None):
    """Return the project's sandboxes (a queryset, for cursor paging), those carrying every label
    of ``labels`` when given, and those of job attempt ``attempt_id`` alone when given."""
    sandboxes = Sandbox.objects.for_project(project).select_related("attempt__job")
    if attempt_id is not None:
        sandboxes = sandboxes.filter(attempt_id=attempt_id)
    return with_labels(sandboxes, labels or {})


def sandbox_delete(*, sandbox: Sandbox, actor: Actor) -> Sandbox:
    """Stop ``sandbox`` and delete its files; the row stays, ``stopped`` (idempotent)."""
    with transaction.atomic():
        audit_record(
            actor=actor, organization=sandbox.project.organization, project=sandbox.project,
            action=AuditAction.SANDBOX_DELETE, target=sandbox.public_id,
        )
    return _finish(sandbox, SandboxStatus.STOPPED)


#: Most ids one bulk delete may name.
MAX_BULK_IDS = 1000


@dataclass(frozen=True)
class SandboxBulkDelete:
    """A valid bulk-delete body: the ``sandbox_ids`` named and the ``labels`` every one to delete carries."""

    sandbox_ids: list[str]
    labels: dict[str, str]


def parse_sandbox_bulk_delete(data: Any) -> SandboxBulkDelete:
    """Return the ids and labels of a bulk-delete body ``{"ids": [...], "labels": {...}}`` (either
    or both; docs/sandboxes.md), or raise ``invalid_request`` naming the bad field."""
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    problems = _Problems()
    for key in data:
        if key not in ("ids", "labels"):
            problems.add(key, "unknown_field", f"Unknown field {key!r}.")
    sandbox_ids = data.get("ids") or []
    if not isinstance(sandbox_ids, list) or len(sandbox_ids) > MAX_BULK_IDS or not all(
        isinstance(item, str) and 0 < len(item) <= 40 and "\x00" not in item for item in sandbox_ids
    ):
        problems.add("ids", "invalid", f"ids must be a list of at most {MAX_BULK_IDS} sandbox ids.")
        sandbox_ids = []
    labels = _labels(data.get("labels"), problems)
    if not problems.errors and not sandbox_ids and not labels:
        problems.add("ids", "required", "Name the sandboxes to delete: ids, labels or both.")
    problems.raise_any()
    return SandboxBulkDelete(sandbox_ids=list(dict.fromkeys(sandbox_ids)), labels=labels)


def sandbox_bulk_delete(
    *, project: Project, actor: Actor, sandbox_ids: list[str], labels: dict[str, str], attempt_id: int | None = None
) -> tuple[list[str], list[str]]:
    """Delete the project's sandboxes named in ``sandbox_ids`` and its active ones carrying every
    label of ``labels`` (when given), only job attempt ``attempt_id``'s when given; return the ids
    deleted (those named in their order, then those labelled, newest first) and the ids not found
    (another project's, organization's or attempt's included, exactly as missing ones); each
    deleted sandbox gets its ``sandbox.delete`` audit row."""
    reachable = sandbox_list(project=project, attempt_id=attempt_id).select_related("project__organization")
    named = {sandbox.public_id: sandbox for sandbox in reachable.filter(public_id__in=sandbox_ids)}
    found = {sandbox_id: named[sandbox_id] for sandbox_id in sandbox_ids if sandbox_id in named}
    if labels:
        labelled = sandbox_list(project=project, labels=labels, attempt_id=attempt_id).select_related("project__organization")
        for sandbox in labelled.filter(status__in=ACTIVE_STATUSES).order_by("-id"):
            found.setdefault(sandbox.public_id, sandbox)
    for sandbox in found.values():
        sandbox_delete(sandbox=sandbox, actor=actor)
    return list(found), [sandbox_id for sandbox_id in sandbox_ids if sandbox_id not in found]


def _finish(sandbox: Sandbox, status: SandboxStatus, *, error: str = "", keep: bool = True) -> Sandbox:
    """Move an active ``sandbox`` to ``status`` (a conditional UPDATE: once), keep its log (the
    call that ended it, unless ``keep`` is False: a sandbox that never started has none), delete
    its files, and close its usage on the billing ledger (``sandbox_bill`` closes it later if this
    fails)."""
    ended = Sandbox.objects.unscoped().filter(pk=sandbox.pk, status__in=ACTIVE_STATUSES).update(
        status=status, stopped_at=timezone.now(), error=error[:500]
    )
    agent, spec = placement.agent_of(sandbox), sandbox_spec(sandbox)
    if ended and keep:
        keep_log(sandbox, agent=agent, spec=spec)
    try:
        agent.destroy(spec)
    except RuntimeRefusal as refusal:  # the agent also stops it at the end of its lifetime
        logger.warning("sandbox %s: the agent did not confirm its stop: %s", sandbox.public_id, refusal.message)
    if sandbox.pod_name:
        placement.release_pod(sandbox.pod_name, sandbox_id=sandbox.public_id)
    _close_usage(sandbox)
    sandbox.refresh_from_db()
    return sandbox


def _close_usage(sandbox: Sandbox) -> None:
    """Close the usage of an ended ``sandbox``; a failure is logged, and the periodic ``sandbox_bill`` closes it."""
    try:
        sandbox_usage_close(sandbox_ids=[sandbox.pk])
    except Exception:
        logger.exception("sandbox %s: closing its usage failed; the next billing pass closes it", sandbox.public_id)


def sandbox_bill(*, now: datetime | None = None) -> int:
    """Close the due usage of every sandbox on the billing ledger (``sandboxes.usage``), then stop
    the running sandboxes not made by a job of each organization left with nothing to spend
    (``stopped``, the reason in ``error``: the jobs' message for that bound); return how many
    intervals were closed. A job's sandboxes end with its attempt, which billing stops as well."""
    result = sandbox_usage_close(now=now)
    if result.used_up:
        unpaid = Sandbox.objects.unscoped().filter(
            organization_id__in=set(result.used_up), status=SandboxStatus.RUNNING, attempt__isnull=True
        ).select_related("project__organization")
        for sandbox in unpaid.order_by("pk"):
            message = BLOCKER_MESSAGES[result.used_up[sandbox.organization_id]]
            _finish(sandbox, SandboxStatus.STOPPED, error=f"Stopped: {message}")
    return len(result.closed)


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


#: The error of a running sandbox its agent no longer holds (it restarted, or was killed).
LOST_ERROR = "The sandbox agent no longer holds this sandbox (it restarted or was killed); its processes and files were lost."


def sandbox_reconcile() -> int:
    """End every ``running`` sandbox its agent no longer holds (``placement.held_sandboxes``: on
    the pool, its pod gone, ending or restarted): ``failed`` with ``LOST_ERROR``, out of the
    organization's cap, its pod deleted, one ``sandbox.lost`` audit row each; return how many.
    Only sandboxes started before the agent was asked count, so one started meanwhile is never
    taken for lost. An agent or a cluster that cannot be reached ends nothing."""
    asked_at = timezone.now()
    if (seen := placement.held_sandboxes()) is None:
        return 0
    instance, held, pooled = seen
    running = Sandbox.objects.unscoped().filter(status=SandboxStatus.RUNNING, started_at__lt=asked_at).select_related("project__organization")
    running = running.exclude(pod_name="") if pooled else running.filter(pod_name="")
    lost = 0
    for sandbox in running.exclude(public_id__in=held).order_by("pk"):
        with transaction.atomic():
            ended = Sandbox.objects.unscoped().filter(pk=sandbox.pk, status=SandboxStatus.RUNNING).update(
                status=SandboxStatus.FAILED, stopped_at=timezone.now(), error=LOST_ERROR
            )
            if not ended:  # deleted or reaped meanwhile
                continue
            audit_record(
                actor=Actor.system(), organization=sandbox.project.organization, project=sandbox.project,
                action=AuditAction.SANDBOX_LOST, target=sandbox.public_id, data={"agent_instance": instance},
            )
        logger.warning("sandbox %s: %s", sandbox.public_id, LOST_ERROR)
        if sandbox.pod_name:
            placement.release_pod(sandbox.pod_name, sandbox_id=sandbox.public_id)
        lost += 1
    return lost


# --- data plane access ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DataPlaneAccess:
    """How a client reaches a sandbox's commands and files: the agent's ``url``, a ``token`` for
    that sandbox alone, and when the token expires (the earlier of ``LAB_SANDBOX_TOKEN_TTL_S``
    from now and the end of the sandbox's lifetime)."""

    url: str
    token: str
    expires_at: datetime


def sandbox_access(*, sandbox: Sandbox, now: datetime | None = None) -> DataPlaneAccess:
    """Return data-plane access to a running ``sandbox``; ``invalid_state`` when it is not
    running or past its lifetime."""
    now = now or timezone.now()
    ends_at = sandbox_ends_at(sandbox)
    if sandbox.status != SandboxStatus.RUNNING or ends_at <= now:
        raise LabError("invalid_state", f"The sandbox is {sandbox.status if ends_at > now else 'past its lifetime'}.")
    expires_at = min(now + timedelta(seconds=settings.LAB_SANDBOX_TOKEN_TTL_S), ends_at).replace(microsecond=0)
    token = placement.agent_of(sandbox).token(sandbox.public_id, expires_at=expires_at.timestamp())
    return DataPlaneAccess(url=placement.data_plane_url(sandbox), token=token, expires_at=expires_at)
