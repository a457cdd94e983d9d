"""Reading what a sandbox's commands printed (docs/sandboxes.md "Logs"): a running sandbox's log
from its agent, an ended one's as Lab kept it when it ended it (``sandboxes.kept_logs``). Every
read is audited (``sandbox.read_logs``); refusals are ``lab.errors.LabError`` ``invalid_state``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from lab.audit import Actor, AuditAction, audit_record
from lab.errors import LabError
from sandboxes import placement
from sandboxes.kept_logs import kept_log, log_expired
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime.base import RuntimeRefusal
from sandboxes.services import LOST_ERROR, sandbox_spec


@dataclass(frozen=True)
class SandboxLogs:
    """What a sandbox's commands printed: stdout and stderr as text, in the order they came (the
    agent keeps the last ``sandboxes.agent.sandbox.LOG_BYTES``; ``truncated`` when earlier output
    was dropped)."""

    logs: str
    truncated: bool


def sandbox_logs(*, sandbox: Sandbox, actor: Actor) -> SandboxLogs:
    """Return the log of ``sandbox`` and record who read it (``sandbox.read_logs``: a log may hold
    what its commands were given): a running one's from its agent, an ended one's as Lab kept it
    when it ended it (``sandboxes.kept_logs``). ``invalid_state`` when there is none, saying why: not
    started yet, never started, lost with its agent, or its agent could not give it at the end."""
    if sandbox.status == SandboxStatus.PENDING:
        raise LabError("invalid_state", "The sandbox is pending: it has printed nothing yet.")
    kept = None
    if sandbox.status == SandboxStatus.RUNNING:
        try:
            kept = placement.agent_of(sandbox).logs(sandbox_spec(sandbox))
        except RuntimeRefusal as refusal:
            sandbox.refresh_from_db()
            if sandbox.status == SandboxStatus.RUNNING:
                raise LabError("invalid_state", f"The sandbox's log cannot be read: {refusal.message}") from None
    if kept is None:  # it ended, maybe while its agent was being asked
        if (kept := kept_log(sandbox)) is None:
            raise LabError("invalid_state", _no_kept_log(sandbox))
    logs, truncated = kept
    with transaction.atomic():
        audit_record(
            actor=actor, organization=sandbox.project.organization, project=sandbox.project,
            action=AuditAction.SANDBOX_READ_LOGS, target=sandbox.public_id,
        )
    return SandboxLogs(logs=logs, truncated=truncated)


def _no_kept_log(sandbox: Sandbox) -> str:
    """Return why the ended ``sandbox`` has no kept log."""
    if sandbox.started_at is None:
        return f"The sandbox is {sandbox.status}: it never started, so it has no log."
    if sandbox.error == LOST_ERROR:
        return f"The sandbox is {sandbox.status}: its agent lost it, and its log with it."
    if log_expired(sandbox):
        return (
            f"The sandbox is {sandbox.status}: its log was deleted, as every ended sandbox's is "
            f"{settings.LAB_SANDBOX_LOG_RETENTION_DAYS} days after it ended (LAB_SANDBOX_LOG_RETENTION_DAYS)."
        )
    return f"The sandbox is {sandbox.status}: its log was not kept (its agent could not give it when the sandbox ended)."
