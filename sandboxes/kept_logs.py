"""What a sandbox printed, kept past its end (docs/sandboxes.md "Logs").

While a sandbox runs its log lives in its agent's memory beside it (the last
``sandboxes.agent.sandbox.LOG_BYTES`` of what its commands printed). When Lab ends it
(``sandboxes.services._finish``: a delete, the reaper, billing, its job attempt's end), it reads
that log from the agent before the agent destroys the sandbox and keeps it in Lab's object
storage (``lab.storage``) at ``log_key``: one JSON object ``{"logs": text, "truncated": bool}``
under ``sandboxes/logs/<organization public id>/``, one of ``lab.storage.OWNED_PREFIXES`` (the
checkpoint orphan sweep leaves it alone). Who may read it is ``sandboxes.logs``'s, which audits
every read. A kept log lasts ``LAB_SANDBOX_LOG_RETENTION_DAYS`` from when it was kept;
``expire_kept_logs`` (beat, hourly) deletes older ones, and those whose sandbox's row is gone (its
project or organization was deleted) at once.
"""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from lab import storage
from sandboxes.models import Sandbox
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import RuntimeRefusal, SandboxSpec

logger = logging.getLogger(__name__)

#: Where kept logs live: under the organization's public id, then ``<sandbox public id>.json``.
KEY_PREFIX = "sandboxes/logs/"
CONTENT_TYPE = "application/json"
#: Sandbox public ids looked up in one query by the expiry sweep.
_LOOKUP_BATCH = 1000


def log_key(sandbox: Sandbox) -> str:
    """Return the storage key of ``sandbox``'s kept log."""
    return f"{KEY_PREFIX}{sandbox.organization.public_id}/{sandbox.public_id}.json"


def keep_log(sandbox: Sandbox, *, agent: AgentRuntime, spec: SandboxSpec) -> bool:
    """Read ``sandbox``'s log from ``agent`` (which still holds it) and store it at ``log_key``;
    return whether it was kept. An agent that cannot give it (it no longer holds the sandbox, or
    cannot be reached: ``RuntimeRefusal``) or a storage that refuses the write keeps nothing; it
    is logged, never raised, so the sandbox's end goes on."""
    try:
        logs, truncated = agent.logs(spec)
    except RuntimeRefusal as refusal:
        logger.warning("sandbox %s: its log was not kept, the agent could not give it: %s", sandbox.public_id, refusal.message)
        return False
    body = json.dumps({"logs": logs, "truncated": truncated}, ensure_ascii=False).encode()
    try:
        storage.put_stream(log_key(sandbox), io.BytesIO(body), content_type=CONTENT_TYPE)
    except Exception:  # an unreachable bucket must not keep the sandbox from ending
        logger.exception("sandbox %s: its log was not kept, the storage refused it", sandbox.public_id)
        return False
    return True


def kept_log(sandbox: Sandbox) -> tuple[str, bool] | None:
    """Return the kept log of an ended ``sandbox`` as (text, truncated), or None when none was kept."""
    try:
        with storage.open_object(log_key(sandbox)) as handle:
            kept = json.loads(handle.read().decode("utf-8", errors="replace"))
    except FileNotFoundError:
        return None
    return str(kept["logs"]), bool(kept["truncated"])


def retention() -> timedelta:
    """How long a kept log is kept (``LAB_SANDBOX_LOG_RETENTION_DAYS``)."""
    return timedelta(days=settings.LAB_SANDBOX_LOG_RETENTION_DAYS)


def log_expired(sandbox: Sandbox, *, now: datetime | None = None) -> bool:
    """Whether an ended ``sandbox``'s kept log is past its retention (so the sweep deleted it, or will)."""
    return sandbox.stopped_at is not None and sandbox.stopped_at < (now or timezone.now()) - retention()


def expire_kept_logs(*, now: datetime | None = None) -> int:
    """Delete every kept log older than its retention (by when storage last wrote it), and every one
    whose sandbox no longer has a row; return how many were deleted. Keys that are not
    ``<organization>/<sandbox>.json`` under ``KEY_PREFIX`` are left alone."""
    cutoff = (now or timezone.now()) - retention()
    deleted = 0
    pending: dict[str, str] = {}  # sandbox public id -> key, of logs young enough to keep if their row exists

    def flush() -> int:
        existing = set(Sandbox.objects.unscoped().filter(public_id__in=list(pending)).values_list("public_id", flat=True))
        gone = [key for public_id, key in pending.items() if public_id not in existing]
        for key in gone:
            storage.delete(key)
        pending.clear()
        return len(gone)

    for key, modified in storage.iter_objects(KEY_PREFIX):
        parts = key[len(KEY_PREFIX):].split("/")
        if len(parts) != 2 or not parts[1].endswith(".json"):
            continue
        if modified < cutoff:
            storage.delete(key)
            deleted += 1
            continue
        pending[parts[1].removesuffix(".json")] = key
        if len(pending) >= _LOOKUP_BATCH:
            deleted += flush()
    if pending:
        deleted += flush()
    if deleted:
        logger.info("deleted %d kept sandbox logs past their retention or of deleted sandboxes", deleted)
    return deleted
