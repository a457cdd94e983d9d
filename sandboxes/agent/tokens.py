"""Tokens of the sandbox agent: signed, expiring, each good for one sandbox (or for the control
plane's own calls), checked by the agent without asking Lab.

A token is ``sbt_<payload>.<signature>``: the payload is base64url JSON
``{"sbx": sandbox id or "*", "scope": "sandbox"|"control", "exp": unix seconds}`` and the
signature base64url HMAC-SHA256 of the payload under the agent's key. A token of scope ``sandbox``
opens the data plane of its sandbox alone; ``control`` also starts and stops sandboxes (Lab's
control plane mints those for itself).

The one agent of a machine signs with Lab's secret itself (``LAB_SANDBOX_AGENT_SECRET``). Each
agent of the Kubernetes pool has a key of its own, ``agent_key(secret, pod uid)``, and is handed
that key alone: Lab signs a pool sandbox's tokens with the key of the pod holding it, so what
escapes into one pod's agent can sign for that pod and no other (docs/kubernetes.md "Sandbox pool").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PREFIX = "sbt_"
SANDBOX_SCOPE = "sandbox"
CONTROL_SCOPE = "control"


@dataclass(frozen=True)
class Grant:
    """What a valid token allows: ``sandbox_id`` (``"*"`` for every sandbox, control tokens
    only), its ``scope`` and when it expires (unix seconds)."""

    sandbox_id: str
    scope: str
    expires_at: int

    def opens(self, sandbox_id: str) -> bool:
        """Return whether this grant opens the data plane of ``sandbox_id``."""
        return self.sandbox_id == sandbox_id or (self.scope == CONTROL_SCOPE and self.sandbox_id == "*")


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: bytes, payload: str) -> str:
    return _encode(hmac.new(secret, payload.encode(), hashlib.sha256).digest())


#: The fewest characters a signing key may have.
MIN_SECRET_CHARS = 32


def secret_from_environment(environ: Mapping[str, str], name: str = "LAB_SANDBOX_AGENT_SECRET") -> bytes:
    """Return the key in the variable ``name``, else in the file the variable ``<name>_FILE``
    names (a Kubernetes Secret or an init container's output); ValueError when it holds fewer
    than ``MIN_SECRET_CHARS`` characters."""
    value = environ.get(name, "")
    if not value and environ.get(f"{name}_FILE"):
        value = Path(environ[f"{name}_FILE"]).read_text().strip()
    if len(value) < MIN_SECRET_CHARS:
        raise ValueError(f"{name} (or {name}_FILE) must hold at least {MIN_SECRET_CHARS} characters")
    return value.encode()


def agent_key(secret: bytes, identity: str) -> str:
    """Return the key of the pool's agent ``identity`` (its pod's uid, which the cluster never
    gives another pod): hex HMAC-SHA256 of ``identity`` under Lab's ``secret``, with a label of
    its own so no other use of that secret yields it. The key cannot be turned back into the
    secret, nor into another agent's key."""
    if not identity:
        raise ValueError("an agent's identity is empty")
    return hmac.new(secret, b"lab sandbox pool agent\0" + identity.encode(), hashlib.sha256).hexdigest()


def issue(secret: bytes, *, sandbox_id: str, expires_at: int, scope: str = SANDBOX_SCOPE) -> str:
    """Return a token for ``sandbox_id`` valid until ``expires_at`` (unix seconds)."""
    payload = _encode(json.dumps({"sbx": sandbox_id, "scope": scope, "exp": int(expires_at)}, separators=(",", ":")).encode())
    return f"{PREFIX}{payload}.{_signature(secret, payload)}"


def verify(secret: bytes, token: str, *, now: float | None = None) -> Grant | None:
    """Return the grant of ``token``, or None when it is malformed, signed with another secret or
    expired. Never raises on hostile input."""
    if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > 1024:
        return None
    payload, _, signature = token[len(PREFIX):].partition(".")
    if not payload or not hmac.compare_digest(signature.encode(), _signature(secret, payload).encode()):
        return None
    try:
        claims = json.loads(_decode(payload))
        grant = Grant(sandbox_id=str(claims["sbx"]), scope=str(claims["scope"]), expires_at=int(claims["exp"]))
    except (ValueError, KeyError, TypeError):
        return None
    if grant.scope not in (SANDBOX_SCOPE, CONTROL_SCOPE) or (now if now is not None else time.time()) >= grant.expires_at:
        return None
    return grant


def bearer(headers: dict[str, str]) -> str:
    """Return the token of an ``Authorization: Bearer`` header (lower-cased header names), or ''."""
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
