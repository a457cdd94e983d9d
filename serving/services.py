"""Deployment services: create (within the organization's cap and what billing allows), delete,
and every status change with its event and webhooks (docs/serving.md).

Each write runs in one short transaction; the inference servers are started, told and stopped by
``serving.servers`` outside it. Refusals are ``lab.errors.LabError``: ``invalid_request`` (the
field as ``param``), ``checkpoint_not_ready`` / ``adapter_not_ready`` (409), ``rate_limited``
(the organization's cap on deployments), ``insufficient_credit`` / ``spend_limit_reached`` /
``payment_failed`` (402), ``not_found``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.accounts import BLOCKER_MESSAGES, organization_run_blocker
from jobs.models import Adapter, AdapterStatus, Checkpoint, CheckpointFormat, CheckpointStatus
from jobs.specs import installed_models
from jobs.webhooks.outbox import publish, subscribed_endpoints
from lab import dispatch
from lab.audit import Actor, AuditAction, audit_record
from lab.celery import TaskName
from lab.errors import FieldError, LabError
from lab.models import Organization, Project
from serving.models import (
    ACTIVE_STATUSES,
    Deployment,
    DeploymentEvent,
    DeploymentEventType,
    DeploymentStatus,
    ServingMode,
    SourceType,
)
from serving.serializers import deployment_to_dict

#: A deployment's name: what OpenAI clients send as ``model``.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}")
#: What a checkpoint's or an adapter's id may look like (another string names none of them).
_ARTIFACT_ID = re.compile(r"[A-Za-z0-9_]{1,64}")
_CREATE_FIELDS = {"name", "source"}

#: Where each status may go (``deployment_transition``).
ALLOWED_TRANSITIONS = {
    DeploymentStatus.PENDING: {DeploymentStatus.DEPLOYING, DeploymentStatus.FAILED, DeploymentStatus.UNLOADING},
    DeploymentStatus.DEPLOYING: {DeploymentStatus.READY, DeploymentStatus.FAILED, DeploymentStatus.UNLOADING},
    DeploymentStatus.READY: {DeploymentStatus.UNLOADING},
    DeploymentStatus.UNLOADING: {DeploymentStatus.STOPPED},
    DeploymentStatus.STOPPED: set(),
    DeploymentStatus.FAILED: set(),
}
#: The events a webhook endpoint may subscribe to.
WEBHOOK_EVENTS = (DeploymentEventType.READY, DeploymentEventType.FAILED)


@dataclass(frozen=True)
class DeploymentSource:
    """A checked source: its type and id, the base model under it, and how it is served."""

    type: str
    id: str
    base_model: str
    mode: str


def _source(project: Project, value: Any) -> DeploymentSource:
    """Return the source a create body names, or raise: ``invalid_request`` for a malformed one
    or an id this project does not have (another project's is as unknown as a missing one),
    ``<kind>_not_ready`` for a checkpoint or adapter that is not ready."""
    if not isinstance(value, dict) or set(value) != {"type", "id"} or not isinstance(value.get("id"), str) or not value["id"]:
        raise LabError("invalid_request", 'source must be {"type": "checkpoint" | "adapter" | "model", "id": "..."}.',
                       errors=[FieldError("source", "invalid", "source is an object of type and id.")])
    kind, source_id = value["type"], value["id"]
    if kind == SourceType.MODEL:
        if source_id not in installed_models(project.organization):
            raise LabError("invalid_request", f"Unknown model {source_id!r}; GET /api/v1/models lists the installed ones.",
                           errors=[FieldError("source.id", "unknown_model", f"Unknown model {source_id!r}.")])
        return DeploymentSource(kind, source_id, source_id, ServingMode.BASE)
    if kind not in (SourceType.CHECKPOINT, SourceType.ADAPTER):
        raise LabError("invalid_request", "source.type must be checkpoint, adapter or model.",
                       errors=[FieldError("source.type", "invalid", "source.type must be checkpoint, adapter or model.")])
    model, ready = (Checkpoint, CheckpointStatus.READY) if kind == SourceType.CHECKPOINT else (Adapter, AdapterStatus.READY)
    artifact = (
        model.objects.for_project(project).select_related("job").filter(public_id=source_id).first()
        if _ARTIFACT_ID.fullmatch(source_id) else None
    )
    if artifact is None:
        raise LabError("invalid_request", f"No {kind} {source_id!r} in this project.",
                       errors=[FieldError("source.id", "not_found", f"No {kind} {source_id!r} in this project.")])
    if artifact.status != ready:
        raise LabError(f"{kind}_not_ready", f"{kind.capitalize()} {source_id} is {artifact.status}; only ready ones can be deployed.",
                       param="source.id")
    mode = ServingMode.ADAPTER if artifact.format == CheckpointFormat.PEFT_LORA else ServingMode.DEDICATED
    return DeploymentSource(kind, source_id, artifact.job.model, mode)


def default_name(source: DeploymentSource) -> str:
    """Return the name a deployment gets when none is given: the model's id for a catalogue model,
    ``<base model>:<checkpoint or adapter id>`` otherwise (as Prime Intellect names adapters)."""
    return source.id if source.type == SourceType.MODEL else f"{source.base_model}:{source.id}"


def parse_deployment_create(project: Project, data: Any) -> tuple[str, DeploymentSource]:
    """Return (name, source) of a create body ``{"source": {"type", "id"}, "name"?}``, or raise
    ``invalid_request`` naming the bad field (and the states ``_source`` refuses)."""
    if not isinstance(data, dict):
        raise LabError("invalid_request", "The body must be a JSON object.")
    unknown = sorted(set(data) - _CREATE_FIELDS)
    if unknown:
        raise LabError("invalid_request", f"Unknown field {unknown[0]!r}; the fields are name and source.",
                       errors=[FieldError(key, "unknown_field", f"Unknown field {key!r}.") for key in unknown])
    if "source" not in data:
        raise LabError("invalid_request", "source is required.", errors=[FieldError("source", "required", "source is required.")])
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        raise LabError("invalid_request", "name must be 1 to 200 letters, digits or . _ : / @ + -, starting with a letter or digit.",
                       errors=[FieldError("name", "invalid", "name must be 1 to 200 letters, digits or . _ : / @ + -.")])
    source = _source(project, data["source"])
    return name or default_name(source), source


def deployment_create(*, project: Project, actor: Actor, data: Any) -> Deployment:
    """Create a deployment from a request body; return it ``pending`` (its weights are prepared
    and its server started by ``serving.servers`` after commit).

    The organization's row is locked while its active deployments are counted, so concurrent
    creates cannot pass ``LAB_SERVING_MAX_DEPLOYMENTS_PER_ORG`` together (``rate_limited``);
    a name already held by an active deployment of the project is ``invalid_request``; nothing
    is created when billing allows nothing to run (402).
    """
    name, source = parse_deployment_create(project, data)
    blocker = organization_run_blocker(project.organization_id)
    if blocker is not None:
        raise LabError(blocker, BLOCKER_MESSAGES[blocker].replace("run jobs", "deploy"))
    with transaction.atomic():
        Organization.objects.select_for_update().filter(pk=project.organization_id).first()
        active = Deployment.objects.unscoped().filter(organization_id=project.organization_id, status__in=ACTIVE_STATUSES)
        cap = settings.LAB_SERVING_MAX_DEPLOYMENTS_PER_ORG
        if active.count() >= cap:
            raise LabError("rate_limited", f"The organization already has {cap} deployments (its cap); delete one first.")
        if active.filter(project=project, name=name).exists():
            raise LabError("invalid_request", f"The name {name!r} is taken by an active deployment of this project; delete it or choose another name.",
                           errors=[FieldError("name", "taken", f"{name!r} is taken.")])
        deployment = Deployment.objects.create(
            organization_id=project.organization_id, project=project, name=name, source_type=source.type, source_id=source.id,
            base_model=source.base_model, mode=source.mode, created_by=actor.user, created_by_key=actor.api_key,
        )
        _record_event(deployment, DeploymentEventType.PENDING, f"Deployment of {source.type} {source.id} accepted as {name}.")
        audit_record(actor=actor, organization=project.organization, project=project, action=AuditAction.DEPLOYMENT_CREATE,
                     target=deployment.public_id, data={"name": name, "source": {"type": source.type, "id": source.id}})
        dispatch.enqueue_on_commit(TaskName.RECONCILE_SERVING)
    return deployment


def deployment_delete(*, deployment: Deployment, actor: Actor) -> Deployment:
    """Delete a deployment: it turns ``unloading`` and leaves its server (which stops once it
    holds nothing), then ``stopped``; return it. Deleting a stopped or failed one changes nothing."""
    with transaction.atomic():
        locked = Deployment.objects.unscoped().select_for_update().get(pk=deployment.pk)
        if locked.status in ACTIVE_STATUSES and locked.status != DeploymentStatus.UNLOADING:
            deployment_transition(deployment=locked, to=DeploymentStatus.UNLOADING, message="Deleted; leaving its inference server.")
            audit_record(actor=actor, organization=locked.project.organization, project=locked.project,
                         action=AuditAction.DEPLOYMENT_DELETE, target=locked.public_id)
            dispatch.enqueue_on_commit(TaskName.RECONCILE_SERVING)
    return Deployment.objects.unscoped().select_related("server").get(pk=deployment.pk)


def deployment_transition(*, deployment: Deployment, to: str, message: str = "", reason: str = "") -> bool:
    """Move a deployment (locked by the caller, or claimed by this conditional update) to ``to``,
    recording its event and, for ``ready`` and ``failed``, the webhooks; return whether it moved
    (False: it was no longer in the status read, another pass moved it first).

    ``reason`` becomes ``status_reason`` (why it failed). Raises ValueError for a move
    ``ALLOWED_TRANSITIONS`` does not allow.
    """
    if to not in ALLOWED_TRANSITIONS[DeploymentStatus(deployment.status)]:
        raise ValueError(f"a deployment does not go from {deployment.status} to {to}")
    now = timezone.now()
    changes: dict[str, Any] = {"status": to, "status_reason": reason[:500]}
    if to == DeploymentStatus.READY:
        changes["ready_at"] = now
    if to in (DeploymentStatus.STOPPED, DeploymentStatus.FAILED):
        changes["stopped_at"] = now
    with transaction.atomic():
        moved = Deployment.objects.unscoped().filter(pk=deployment.pk, status=deployment.status).update(**changes)
        if not moved:
            return False
        for field, value in changes.items():
            setattr(deployment, field, value)
        _record_event(deployment, DeploymentEventType(f"deployment.{to}"), message or reason, level="error" if to == DeploymentStatus.FAILED else "info")
    return True


def _record_event(deployment: Deployment, type: DeploymentEventType, message: str, *, level: str = "info") -> DeploymentEvent:
    """Write the event and, for a webhook event type, its outbox messages (same transaction)."""
    event = DeploymentEvent.objects.create(deployment=deployment, type=type, level=level, message=message,
                                           data={"status": deployment.status, "status_reason": deployment.status_reason or None})
    if type in WEBHOOK_EVENTS:
        endpoints = subscribed_endpoints(project_id=deployment.project_id, type=type)
        if endpoints:
            deployment = Deployment.objects.unscoped().select_related("server").get(pk=deployment.pk)
            publish(project_id=deployment.project_id, type=type, data=deployment_to_dict(deployment), endpoints=endpoints,
                    created_at=event.created_at, public_id=event.public_id)
    return event
