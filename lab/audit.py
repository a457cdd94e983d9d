"""The audit log: who did what, written by every state-changing service in its own transaction.

``audit_record`` writes one ``AuditLogEntry``; ``Actor`` says who acted; ``AuditAction`` lists
every action that may be recorded, so a new one is added here first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from lab.logging import request_id_var
from lab.models import ApiKey, AuditLogEntry, Organization, Project, User


class AuditAction(StrEnum):
    """The ``action`` of an audit row: ``<object>.<verb>``, stored as that string."""

    ORGANIZATION_CREATE = "organization.create"
    PROJECT_CREATE = "project.create"
    API_KEY_CREATE = "api_key.create"
    API_KEY_REVOKE = "api_key.revoke"
    INVITATION_CREATE = "invitation.create"
    INVITATION_ACCEPT = "invitation.accept"
    INVITATION_REVOKE = "invitation.revoke"
    MEMBERSHIP_SET_ROLE = "membership.set_role"
    MEMBERSHIP_REMOVE = "membership.remove"
    JOB_CREATE = "job.create"
    JOB_CANCEL = "job.cancel"
    JOB_RESTART = "job.restart"
    JOB_DELETE = "job.delete"
    WEBHOOK_ENDPOINT_CREATE = "webhook_endpoint.create"
    WEBHOOK_ENDPOINT_UPDATE = "webhook_endpoint.update"
    WEBHOOK_ENDPOINT_DELETE = "webhook_endpoint.delete"
    WEBHOOK_ENDPOINT_ROTATE_SECRET = "webhook_endpoint.rotate_secret"
    WEBHOOK_ENDPOINT_TEST = "webhook_endpoint.test"
    WEBHOOK_ENDPOINT_DISABLE = "webhook_endpoint.disable"
    WEBHOOK_DELIVERY_REDELIVER = "webhook_delivery.redeliver"
    BILLING_SETTINGS_UPDATE = "billing.settings_update"
    BILLING_CHECKOUT_CREATE = "billing.checkout_create"
    ENVIRONMENT_PUSH = "environment.push"
    ENVIRONMENT_DELETE = "environment.delete"
    DATASET_PUSH = "dataset.push"
    DATASET_DELETE = "dataset.delete"
    SANDBOX_CREATE = "sandbox.create"
    SANDBOX_DELETE = "sandbox.delete"
    SANDBOX_LOST = "sandbox.lost"
    SANDBOX_READ_LOGS = "sandbox.read_logs"
    DEPLOYMENT_CREATE = "deployment.create"
    DEPLOYMENT_DELETE = "deployment.delete"
    EVALUATION_CREATE = "evaluation.create"
    EVALUATION_CANCEL = "evaluation.cancel"
    EVALUATION_RETRY = "evaluation.retry"
    EVALUATION_DELETE = "evaluation.delete"
    EVALUATION_PUSH = "evaluation.push"
    EVALUATION_FINALIZE = "evaluation.finalize"
    MODEL_ADD = "model.add"
    MODEL_PUSH = "model.push"


@dataclass(frozen=True)
class Actor:
    """Who performs an action: a signed-in user, an API key, or the system (both None)."""

    user: User | None = None
    api_key: ApiKey | None = None

    @classmethod
    def system(cls) -> Actor:
        """Return the actor for actions Lab takes by itself (reconciler, commands)."""
        return cls()


def audit_record(
    *,
    actor: Actor,
    organization: Organization,
    action: AuditAction,
    project: Project | None = None,
    target: str = "",
    data: dict[str, Any] | None = None,
) -> AuditLogEntry:
    """Write one audit row for a state-changing action (call inside the action's transaction).

    ``target`` names the object acted on (a public id, slug or email); ``data`` is stored as
    JSON. The row carries the current request's id. Raises ValueError for an ``action`` that is
    not an ``AuditAction``, so a misspelt one never reaches the log.
    """
    return AuditLogEntry.objects.create(
        organization=organization,
        project=project,
        actor_user=actor.user,
        actor_api_key=actor.api_key,
        action=AuditAction(action).value,
        target=target,
        data=data or {},
        request_id=request_id_var.get() or "",
    )
