"""``AgentRuntime``: the sandbox runtime as Lab's control plane reaches it, a client of the
sandbox agent (``sandboxes.agent``) over HTTP.

It starts and destroys sandboxes with a short control token it signs itself; commands and files
go through the agent's data plane with a token for that one sandbox, as any client's would.
Network errors and the agent's 5xx are ``RuntimeRefusal("agent_unavailable")``.
"""

from __future__ import annotations

import time

import httpx

from sandboxes.agent import tokens
from sandboxes.runtime.base import CommandRequest, CommandResult, RuntimeRefusal, SandboxRuntime, SandboxSpec

#: Lifetime of the control tokens this client signs for each call (seconds).
CONTROL_TOKEN_S = 60


class AgentRuntime(SandboxRuntime):
    """Sandboxes held by the agent at ``url``, signed for with ``secret``."""

    def __init__(self, url: str, *, secret: bytes, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.secret = secret
        self._client = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=5.0))

    def token(self, sandbox_id: str, *, expires_at: float) -> str:
        """Return a data-plane token for ``sandbox_id`` valid until ``expires_at`` (unix seconds)."""
        return tokens.issue(self.secret, sandbox_id=sandbox_id, expires_at=int(expires_at))

    def _control(self) -> dict[str, str]:
        token = tokens.issue(self.secret, sandbox_id="*", scope=tokens.CONTROL_SCOPE, expires_at=int(time.time()) + CONTROL_TOKEN_S)
        return {"Authorization": f"Bearer {token}"}

    def _data(self, spec: SandboxSpec) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(spec.sandbox_id, expires_at=time.time() + CONTROL_TOKEN_S)}"}

    def _call(self, method: str, path: str, *, timeout: float | None = None, **kwargs) -> httpx.Response:
        try:
            response = self._client.request(method, path, timeout=timeout or httpx.USE_CLIENT_DEFAULT, **kwargs)
        except httpx.HTTPError as error:
            raise RuntimeRefusal("agent_unavailable", f"The sandbox agent at {self.url} is not reachable: {error}") from None
        if response.status_code >= 500:
            raise RuntimeRefusal("agent_unavailable", f"The sandbox agent answered {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise RuntimeRefusal(str(error["code"]), str(error["message"]))
            except (ValueError, KeyError, TypeError):
                raise RuntimeRefusal("agent_error", f"The sandbox agent answered {response.status_code}.") from None
        return response

    def start(self, spec: SandboxSpec) -> None:
        """Start the sandbox on the agent (idempotent)."""
        body = {
            "image": spec.image, "cpu_cores": spec.cpu_cores, "memory_gb": spec.memory_gb, "disk_gb": spec.disk_gb,
            "network": spec.network, "environment": dict(spec.environment), "expires_at": spec.expires_at,
            "start_command": list(spec.start_command),
        }
        self._call("PUT", f"/v1/sandboxes/{spec.sandbox_id}", json=body, headers=self._control())

    def held(self) -> tuple[str, frozenset[str]]:
        """Return the agent's instance id (another after each restart) and the ids of the sandboxes
        it holds; RuntimeRefusal ``agent_unavailable`` when it cannot be reached."""
        answer = self._call("GET", "/v1/sandboxes", headers=self._control()).json()
        return str(answer["instance"]), frozenset(str(sandbox_id) for sandbox_id in answer["sandboxes"])

    def host_uid(self, spec: SandboxSpec) -> int | None:
        """Return the host uid the agent runs the sandbox as (None when it cannot switch uids)."""
        return self._call("GET", f"/v1/sandboxes/{spec.sandbox_id}", headers=self._control()).json()["host_uid"]

    def destroy(self, spec: SandboxSpec) -> None:
        """Stop the sandbox and delete its files (idempotent)."""
        self._call("DELETE", f"/v1/sandboxes/{spec.sandbox_id}", headers=self._control())

    def logs(self, spec: SandboxSpec) -> tuple[str, bool]:
        """Return what the sandbox's commands printed (stdout and stderr in the order they came,
        the agent's last ``LOG_BYTES``) and whether earlier output was dropped; RuntimeRefusal
        ``not_found`` when the agent does not hold it."""
        answer = self._call("GET", f"/v1/sandboxes/{spec.sandbox_id}/logs", headers=self._control()).json()
        return str(answer["logs"]), bool(answer["truncated"])

    def run(self, spec: SandboxSpec, request: CommandRequest) -> CommandResult:
        """Run ``request`` through the data plane and wait for it."""
        body = {"command": list(request.argv), "timeout_s": request.timeout_s, "cwd": request.cwd, "env": dict(request.environment)}
        answer = self._call("POST", f"/v1/sandboxes/{spec.sandbox_id}/commands", json=body, headers=self._data(spec),
                            timeout=request.timeout_s + 30).json()
        return CommandResult(**{key: answer[key] for key in ("stdout", "stderr", "exit_code", "duration_ms", "timed_out", "truncated", "oom_killed")})

    def write_file(self, spec: SandboxSpec, path: str, data: bytes) -> str:
        """Write ``data`` at ``path`` through the data plane; return the path inside."""
        return self._call("PUT", f"/v1/sandboxes/{spec.sandbox_id}/files", params={"path": path}, content=data,
                          headers=self._data(spec)).json()["path"]

    def read_file(self, spec: SandboxSpec, path: str, *, max_bytes: int) -> bytes:
        """Return the file at ``path`` through the data plane (RuntimeRefusal ``file_too_large``
        over ``max_bytes``)."""
        data = self._call("GET", f"/v1/sandboxes/{spec.sandbox_id}/files", params={"path": path}, headers=self._data(spec)).content
        if len(data) > max_bytes:
            raise RuntimeRefusal("file_too_large", f"The file is larger than {max_bytes} bytes.")
        return data
