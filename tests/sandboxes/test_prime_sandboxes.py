"""Prime's own ``prime-sandboxes`` 0.5.1 (its SandboxClient, in this process) against a live Lab at
``<lab>/prime`` and the session's real sandbox agent: create, wait_for_creation, list, get,
execute_command over Connect RPC, background jobs and their status, files, logs, delete and bulk
delete, /sandbox/{id}/auth, and another organization's key. Every control-plane request the
SDK sends is recorded and compared with the routes docs/prime-compat.md lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prime_sandboxes import (
    APIClient,
    APIError,
    CommandTimeoutError,
    CreateSandboxRequest,
    SandboxClient,
    SandboxNotRunningError,
    StartCommand,
)

from lab.models import AuditLogEntry
from sandboxes.models import Sandbox

pytestmark = [pytest.mark.django_db(transaction=True)]

PRIME = Path(sys.executable).with_name("prime")


@pytest.fixture
def prime(live_server, tmp_path, monkeypatch):
    """Return ``make(key)``: a SandboxClient of the SDK for ``key`` and the list its control-plane
    requests are recorded in, as ``"METHOD /path"``."""
    monkeypatch.setenv("HOME", str(tmp_path))  # its config and auth cache live under ~/.prime
    monkeypatch.setenv("PRIME_API_BASE_URL", f"{live_server.url}/prime")
    monkeypatch.setenv("PRIME_DISABLE_VERSION_CHECK", "1")
    monkeypatch.delenv("PRIME_TEAM_ID", raising=False)

    def make(key: str) -> tuple[SandboxClient, list[str]]:
        api = APIClient(api_key=key)
        sent: list[str] = []
        api.client.event_hooks["request"].append(lambda request: sent.append(f"{request.method} {request.url.path}"))
        client = SandboxClient(api)
        client.clear_auth_cache()
        return client, sent

    return make


def test_prime_sandboxes_creates_runs_moves_files_and_deletes_on_lab(prime, owner, tmp_path):
    client, sent = prime(owner.key)
    sandbox = client.create(CreateSandboxRequest(
        name="grader", docker_image="python:3.11-slim", timeout_minutes=10, labels=["env=code", "grader"],
        environment_vars={"GREETING": "hello"},
    ))
    client.wait_for_creation(sandbox.id)
    result = client.execute_command(sandbox.id, "echo $GREETING $EXTRA; pwd; echo oops >&2; exit 3", working_dir="/tmp", env={"EXTRA": "x"})
    local = tmp_path / "solution.py"
    local.write_text("print(6 * 7)\n")
    uploaded = client.upload_file(sandbox.id, "/workspace/solution.py", str(local))
    ran = client.execute_command(sandbox.id, "python3 solution.py > answer.txt", working_dir="/workspace")
    client.download_file(sandbox.id, "/workspace/answer.txt", str(tmp_path / "answer.txt"))
    job = client.start_background_job(sandbox.id, "sleep 1; echo done; echo warn >&2; exit 5")
    first = client.get_background_job(sandbox.id, job)
    deadline = time.monotonic() + 30
    while not (status := client.get_background_job(sandbox.id, job)).completed and time.monotonic() < deadline:
        time.sleep(0.3)
    with pytest.raises(CommandTimeoutError):
        client.execute_command(sandbox.id, "sleep 20", timeout=1)
    listed = client.list(labels=["grader"])
    got = client.get(sandbox.id)
    client.delete(sandbox.id)
    gone = client.get(sandbox.id)

    assert (sandbox.status, sandbox.docker_image, sandbox.timeout_minutes, sandbox.labels) == ("RUNNING", "python:3.11", 10, ["env=code", "grader"])
    assert (result.stdout, result.stderr, result.exit_code) == ("hello x\n/tmp\n", "oops\n", 3)
    assert (uploaded.success, uploaded.path, uploaded.size) == (True, "/workspace/solution.py", 13)
    assert ran.exit_code == 0 and (tmp_path / "answer.txt").read_text() == "42\n"
    assert first.completed is False
    assert (status.completed, status.exit_code, status.stdout, status.stderr) == (True, 5, "done\n", "warn\n")
    assert [s.id for s in listed.sandboxes] == [sandbox.id] and listed.total == 1
    assert got.status == "RUNNING" and gone.status == "TERMINATED"
    with pytest.raises(SandboxNotRunningError):
        client.execute_command(sandbox.id, "true")
    assert sent[:3] == ["POST /prime/api/v1/sandbox", "POST /prime/api/v1/sandbox/status:batchGet", f"GET /prime/api/v1/sandbox/{sandbox.id}"]
    assert set(sent) == {
        "POST /prime/api/v1/sandbox", "POST /prime/api/v1/sandbox/status:batchGet", f"GET /prime/api/v1/sandbox/{sandbox.id}",
        f"GET /prime/api/v1/sandbox/{sandbox.id}/error-context", "GET /prime/api/v1/sandbox",
        f"DELETE /prime/api/v1/sandbox/{sandbox.id}",
    }, sent  # no POST .../auth: the create answer's gatewayAuth serves every command


def test_bulk_delete_by_ids_and_labels_and_the_auth_route(prime, owner, agent):
    client, _ = prime(owner.key)
    first = client.create(CreateSandboxRequest(name="a", docker_image="python:3.11", labels=["batch"]))
    second = client.create(CreateSandboxRequest(name="b", docker_image="python:3.11", labels=["batch"]))
    third = client.create(CreateSandboxRequest(name="c", docker_image="python:3.11"))
    auth = client.client.request("POST", f"/sandbox/{third.id}/auth")

    by_ids = client.bulk_delete(sandbox_ids=[first.id, "sbx_" + "0" * 20])
    by_labels = client.bulk_delete(labels=["batch"])

    assert (auth["gateway_url"], auth["user_ns"], auth["job_id"]) == (agent.url, "prime", third.id)
    assert auth["token"].startswith("sbt_") and auth["expires_at"].endswith("Z")
    assert by_ids.succeeded == [first.id] and by_ids.failed == [{"sandbox_id": "sbx_" + "0" * 20, "error": "Sandbox not found"}]
    assert by_labels.succeeded == [second.id]
    assert [client.get(s.id).status for s in (first, second, third)] == ["TERMINATED", "TERMINATED", "RUNNING"]


def test_another_organizations_key_finds_nothing_and_runs_nothing(prime, owner, outsider):
    client, _ = prime(owner.key)
    sandbox = client.create(CreateSandboxRequest(name="mine", docker_image="python:3.11"))
    other, _ = prime(outsider.key)

    for call in (lambda: other.get(sandbox.id), lambda: other.delete(sandbox.id),
                 lambda: other.execute_command(sandbox.id, "touch /workspace/pwned")):
        with pytest.raises(APIError) as refused:
            call()
        assert "HTTP 404" in str(refused.value)
    assert other.bulk_delete(sandbox_ids=[sandbox.id]).succeeded == []
    assert other.list().sandboxes == []
    assert client.execute_command(sandbox.id, "ls /workspace").stdout == ""
    assert client.get(sandbox.id).status == "RUNNING"


def test_a_start_command_runs_as_the_sandbox_starts_and_lives_with_it(prime, owner):
    client, _ = prime(owner.key)
    server = StartCommand(executable="/bin/sh", args=["-c", "echo $$ > /tmp/server; exec sleep 600"])
    sandbox = client.create(CreateSandboxRequest(name="served", docker_image="python:3.11", start_command=server))
    client.wait_for_creation(sandbox.id)
    wait = "while [ ! -s /tmp/server ]; do sleep 0.05; done; cat /proc/$(cat /tmp/server)/cmdline | tr '\\0' ' '"
    assert client.execute_command(sandbox.id, wait, timeout=10).stdout == "sleep 600 "
    client.delete(sandbox.id)


def test_what_lab_cannot_honour_is_refused_before_anything_starts(prime, owner):
    client, _ = prime(owner.key)
    with pytest.raises(APIError) as refused:
        client.create(CreateSandboxRequest(name="x", docker_image="python:3.11", network_allowlist=["example.com"]))
    assert "HTTP 422" in str(refused.value) and "network_allowlist" in str(refused.value)
    with pytest.raises(APIError) as unknown:
        client.create(CreateSandboxRequest(name="x", docker_image="ubuntu:22.04"))
    assert "HTTP 422" in str(unknown.value) and "image" in str(unknown.value)
    assert client.list().total == 0


def test_prime_sandbox_cli_creates_runs_lists_and_deletes(live_server, owner, tmp_path):
    """``prime sandbox`` of the ``prime`` CLI 0.18.0, a subprocess as a user runs it."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("PRIME_", "LAB_"))}
    environment.update(HOME=str(tmp_path), PRIME_API_BASE_URL=f"{live_server.url}/prime", PRIME_API_KEY=owner.key,
                       PRIME_DISABLE_VERSION_CHECK="1", NO_COLOR="1", COLUMNS="200")

    def prime(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(PRIME), "--plain", "sandbox", *argv], env=environment, capture_output=True, text=True, timeout=120)

    created = prime("create", "python:3.11-slim", "--name", "cli", "--timeout-minutes", "5", "--yes")
    assert created.returncode == 0, created.stdout + created.stderr
    sandbox = Sandbox.objects.unscoped().get(project=owner.project)
    ran = prime("run", sandbox.public_id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    listed = prime("list", "--output", "json")
    deleted = prime("delete", sandbox.public_id, "--yes")

    assert sandbox.public_id in created.stdout
    assert "out" in ran.stdout and "err" in ran.stdout + ran.stderr, ran.stdout + ran.stderr
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert [item["id"] for item in json.loads(listed.stdout)["sandboxes"]] == [sandbox.public_id]
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    sandbox.refresh_from_db()
    assert sandbox.status == "stopped"


def test_get_logs_gives_what_the_commands_printed_after_the_delete_too_and_another_organization_a_404(prime, owner, outsider):
    client, sent = prime(owner.key)
    sandbox = client.create(CreateSandboxRequest(name="logged", docker_image="python:3.11"))
    client.execute_command(sandbox.id, "echo hello; echo oops >&2; exit 2")
    other, _ = prime(outsider.key)

    logs = client.get_logs(sandbox.id)
    with pytest.raises(APIError) as foreign:
        other.get_logs(sandbox.id)
    with pytest.raises(APIError) as missing:
        client.get_logs("sbx_" + "0" * 20)
    client.delete(sandbox.id)
    after_delete = client.get_logs(sandbox.id)
    with pytest.raises(APIError) as foreign_after_delete:
        other.get_logs(sandbox.id)

    assert logs == after_delete == "hello\noops\n"
    assert f"GET /prime/api/v1/sandbox/{sandbox.id}/logs" in sent
    assert "HTTP 404" in str(foreign.value) and "HTTP 404" in str(missing.value)
    assert str(foreign.value).replace(sandbox.id, "ID") == str(missing.value).replace("sbx_" + "0" * 20, "ID")
    assert str(foreign_after_delete.value) == str(foreign.value)
    assert AuditLogEntry.objects.filter(action="sandbox.read_logs", target=sandbox.id).count() == 2
