"""The sandbox agent's tokens attacked (sandboxes/agent/tokens.py, app.py, prime.py): a token opens
its own sandbox's data plane and nothing else, and only while it is valid. Each attack is beside
the same request with the right token, which works."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest

from sandboxes.agent import tokens
from sandboxes.runtime.base import CommandRequest, SandboxSpec

COMMAND = {"command": "echo ran > /workspace/ran; echo ran"}


def _spec(name: str) -> SandboxSpec:
    return SandboxSpec(sandbox_id=name, image="python:3.11", cpu_cores=1.0, memory_gb=0.5, disk_gb=0.05, expires_at=time.time() + 600)


@pytest.fixture
def two(runtime):
    """Two running sandboxes of the agent."""
    specs = [_spec("sbx_mine"), _spec("sbx_theirs")]
    for spec in specs:
        runtime.start(spec)
    yield specs
    for spec in specs:
        runtime.destroy(spec)


def _client(agent, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.Client(base_url=agent.url, headers=headers, timeout=30)


def _token(agent, sandbox_id: str, *, seconds: float = 60, secret: str | None = None, scope: str = tokens.SANDBOX_SCOPE) -> str:
    return tokens.issue((secret or agent.secret).encode(), sandbox_id=sandbox_id, expires_at=int(time.time() + seconds), scope=scope)


def test_a_token_runs_commands_in_its_own_sandbox(agent, two):
    answer = _client(agent, _token(agent, "sbx_mine")).post("/v1/sandboxes/sbx_mine/commands", json=COMMAND)
    assert answer.status_code == 200 and answer.json()["stdout"] == "ran\n"


def test_a_token_opens_no_other_sandbox_which_answers_like_a_missing_one(agent, two, runtime):
    mine = _client(agent, _token(agent, "sbx_mine"))
    for method, route, kwargs in (
        ("POST", "commands", {"json": COMMAND}), ("POST", "background", {"json": COMMAND}),
        ("PUT", "files?path=pwned", {"content": b"x"}), ("GET", "files?path=ran", {}),
    ):
        foreign = mine.request(method, f"/v1/sandboxes/sbx_theirs/{route}", **kwargs)
        missing = _client(agent, _token(agent, "sbx_gone")).request(method, f"/v1/sandboxes/sbx_gone/{route}", **kwargs)
        assert foreign.status_code == missing.status_code == 404, (route, foreign.text)
        assert foreign.json() == missing.json()
    theirs = runtime.run(two[1], _command("ls /workspace"))
    assert theirs.stdout == ""


def _command(line: str) -> CommandRequest:
    return CommandRequest(argv=("/bin/sh", "-c", line), timeout_s=10)


@pytest.mark.parametrize("make", [
    lambda agent: None,
    lambda agent: tokens.PREFIX,
    lambda agent: _token(agent, "sbx_mine", secret="x" * 64),
    lambda agent: _token(agent, "sbx_mine", seconds=-1),
    lambda agent: "lab_" + "0" * 40,
    lambda agent: _tampered(_token(agent, "sbx_theirs")),
], ids=["none", "prefix-only", "other-secret", "expired", "api-key", "tampered"])
def test_a_missing_forged_expired_or_tampered_token_is_refused(agent, two, make):
    answer = _client(agent, make(agent)).post("/v1/sandboxes/sbx_mine/commands", json=COMMAND)
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "invalid_token"
    assert not (agent.root / "sbx_mine" / "workspace" / "ran").exists()


def _tampered(token: str) -> str:
    """The token of another sandbox with its payload rewritten to name sbx_mine (signature kept)."""
    payload, signature = token[len(tokens.PREFIX):].split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sbx"] = "sbx_mine"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{tokens.PREFIX}{forged}.{signature}"


def test_a_sandbox_token_cannot_start_or_stop_sandboxes(agent, two):
    mine = _client(agent, _token(agent, "sbx_mine"))
    assert mine.delete("/v1/sandboxes/sbx_mine").status_code == 404
    body = {"image": "python:3.11", "cpu_cores": 1, "memory_gb": 0.5, "disk_gb": 0.05, "expires_at": time.time() + 60}
    assert mine.put("/v1/sandboxes/sbx_new", json=body).status_code == 404
    assert mine.post("/v1/sandboxes/sbx_mine/commands", json=COMMAND).json()["stdout"] == "ran\n"
    assert not (agent.root / "sbx_new").exists()
    control = _client(agent, _token(agent, "*", scope=tokens.CONTROL_SCOPE))
    assert control.delete("/v1/sandboxes/sbx_mine").status_code == 204
    assert mine.post("/v1/sandboxes/sbx_mine/commands", json=COMMAND).status_code == 404


def test_prime_gateway_routes_take_only_the_sandboxs_own_token(agent, two):
    theirs = _client(agent, _token(agent, "sbx_theirs"))
    mine = _client(agent, _token(agent, "sbx_mine"))
    files = {"file": ("x", b"pwned")}
    assert theirs.post("/prime/sbx_mine/upload", params={"path": "/workspace/p"}, files=files).status_code == 401
    assert theirs.get("/prime/sbx_mine/download", params={"path": "/workspace/p"}).status_code == 401
    assert not (agent.root / "sbx_mine" / "workspace" / "p").exists()
    assert mine.post("/prime/sbx_mine/upload", params={"path": "/workspace/p"}, files=files).json()["size"] == 5
    assert mine.get("/prime/sbx_mine/download", params={"path": "/workspace/p"}).content == b"pwned"
    # The REST exec of prime-sandboxes before 0.3.0 likewise.
    assert theirs.post("/prime/sbx_mine/exec", json={"command": "echo x > /workspace/q"}).status_code == 401
    assert not (agent.root / "sbx_mine" / "workspace" / "q").exists()


def test_prime_rest_exec_runs_a_command_under_bash_and_answers_its_output(agent, two):
    mine = _client(agent, _token(agent, "sbx_mine"))
    answer = mine.post("/prime/sbx_mine/exec", json={
        "command": "echo $((6 * 7)) $GREETING; pwd; echo oops >&2; exit 3", "working_dir": "/tmp",
        "env": {"GREETING": "hi"}, "sandbox_id": "sbx_mine", "timeout": 10,
    })
    assert (answer.status_code, answer.json()) == (200, {"stdout": "42 hi\n/tmp\n", "stderr": "oops\n", "exit_code": 3})
    late = mine.post("/prime/sbx_mine/exec", json={"command": "sleep 5", "timeout": 1})
    assert (late.status_code, late.json()["error"]) == (408, "command_timeout")
    assert mine.post("/prime/sbx_mine/exec", json={"command": "id", "user": "root"}).status_code == 400


def test_logs_keep_what_every_command_printed_and_open_only_to_the_control_token(agent, two, runtime):
    mine = _client(agent, _token(agent, "sbx_mine"))
    mine.post("/v1/sandboxes/sbx_mine/commands", json={"command": "echo one; echo two >&2"})
    streamed = mine.post("/v1/sandboxes/sbx_mine/commands", json={"command": "echo three", "stream": True})
    runtime.run(two[1], _command("echo theirs"))

    assert streamed.status_code == 200
    assert runtime.logs(two[0]) == ("one\ntwo\nthree\n", False)
    assert runtime.logs(two[1]) == ("theirs\n", False)
    refused = mine.get("/v1/sandboxes/sbx_mine/logs")
    missing = _client(agent, _token(agent, "*", scope=tokens.CONTROL_SCOPE)).get("/v1/sandboxes/sbx_gone/logs")
    assert refused.status_code == missing.status_code == 404 and refused.json() == missing.json()


def test_logs_keep_the_last_bytes_and_say_when_earlier_ones_were_dropped():
    from sandboxes.agent.sandbox import SandboxLog

    log = SandboxLog(limit=8)
    log.add(b"12345")
    assert (bytes(log.data), log.dropped_bytes) == (b"12345", 0)
    log.add(b"67890")
    assert (bytes(log.data), log.dropped_bytes) == (b"34567890", 2)
