"""The SDK's ``lab.sandboxes`` and the CLI's ``lab sandboxes`` against the real API on a live HTTP
server and the local runtime."""

from __future__ import annotations

import json

import pytest
from labsdk import Lab, NotFoundError
from labsdk.cli import main

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("runtime")]


def test_the_sdk_creates_runs_moves_files_lists_and_deletes(live_server, owner, outsider):
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    sandbox = lab.sandboxes.create(image="python:3.11-slim", timeout_s=120, labels={"env": "code"})
    assert (sandbox.status, sandbox.image, sandbox.timeout_s) == ("running", "python:3.11", 120)
    assert sandbox.warnings and "python:3.11-slim" in sandbox.warnings[0]
    assert lab.sandboxes.upload(sandbox.id, "solution.py", b"print(sum(range(10)))\n") == "/workspace/solution.py"
    result = lab.sandboxes.run(sandbox.id, "python3 solution.py | tee answer.txt")
    assert (result.stdout, result.exit_code, result.timed_out) == ("45\n", 0, False)
    assert lab.sandboxes.run(sandbox.id, ["sh", "-c", "exit 7"]).exit_code == 7
    assert lab.sandboxes.download(sandbox.id, "answer.txt") == b"45\n"
    assert [s.id for s in lab.sandboxes.list(labels={"env": "code"})] == [sandbox.id]
    assert lab.sandboxes.list(labels={"env": "other"}) == []
    with pytest.raises(NotFoundError):
        Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0).sandboxes.get(sandbox.id)
    lab.sandboxes.delete(sandbox.id)
    assert lab.sandboxes.get(sandbox.id).status == "stopped"


def test_the_cli_creates_runs_lists_and_deletes(live_server, owner, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    assert main(["sandboxes", "create", "--label", "env=code", "--timeout", "120"]) == 0
    sandbox_id = capsys.readouterr().out.strip()
    assert sandbox_id.startswith("sbx_")
    assert main(["sandboxes", "run", sandbox_id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"]) == 3
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("out\n", "err\n")
    assert main(["sandboxes", "list", "--json", "--label", "env=code"]) == 0
    assert [s["id"] for s in json.loads(capsys.readouterr().out)] == [sandbox_id]
    assert main(["sandboxes", "delete", sandbox_id]) == 0
    assert main(["sandboxes", "get", sandbox_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["status"] == "stopped"
