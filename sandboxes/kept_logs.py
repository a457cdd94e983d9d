"""What a sandbox printed, kept past its end (docs/sandboxes.md "Logs").

While a sandbox runs its log lives in its agent's memory beside it (the last
``sandboxes.agent.sandbox.LOG_BYTES`` of what its commands printed). When Lab ends it
(``sandboxes.services._finish``: a delete, the reaper, billing, its job attempt's end), it reads
that log from the agent before the agent destroys the sandbox and keeps it in Lab's object
storage (``lab.storage``) at ``log_key``: one JSON object ``{"logs": text, "truncated": bool}``
under ``sandboxes/logs/<organization public id>/``, one of ``lab.storage.OWNED_PREFIXES`` (the
checkpoint orphan sweep leaves it alone). Who may read it is ``sandboxes.logs``'s, which audits
every read.
"""

from __future__ import annotations

import io
import json
import logging

from lab import storage
from sandboxes.models import Sandbox
from sandboxes.runtime.agent import AgentRuntime
from sandboxes.runtime.base import RuntimeRefusal, SandboxSpec

logger = logging.getLogger(__name__)

#: Where kept logs live: under the organization's public id, then ``<sandbox public id>.json``.
KEY_PREFIX = "sandboxes/logs/"
CONTENT_TYPE = "application/json"


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
