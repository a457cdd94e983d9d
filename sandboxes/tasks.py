"""Celery tasks of sandboxes: thin over ``sandboxes.services``."""

from __future__ import annotations

from lab.celery import TaskName, task
from sandboxes.kept_logs import expire_kept_logs
from sandboxes.services import sandbox_bill, sandbox_reap_expired, sandbox_reconcile


@task(TaskName.REAP_SANDBOXES, soft_time_limit=240, time_limit=300)
def reap_sandboxes() -> int:
    """Stop the sandboxes past their lifetime and delete their files, end those the agent no
    longer holds, then close the sandboxes' due usage on the billing ledger (beat, every 30 s);
    return how many ended. Those of ended job attempts are the job reconciler's
    (``jobs.tasks.reconcile``)."""
    ended = sandbox_reap_expired() + sandbox_reconcile()
    sandbox_bill()
    return ended


@task(TaskName.EXPIRE_SANDBOX_LOGS, soft_time_limit=1800, time_limit=1900)
def expire_sandbox_logs() -> int:
    """Delete the kept logs of ended sandboxes past ``LAB_SANDBOX_LOG_RETENTION_DAYS``, and those of
    deleted sandboxes (beat, hourly); return how many were deleted."""
    return expire_kept_logs()
