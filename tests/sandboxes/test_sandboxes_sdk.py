"""The SDK's ``lab.sandboxes`` and the CLI's ``lab sandboxes`` (bulk delete and logs too) against
the real API on a live HTTP server and a real sandbox agent (the data plane)."""

from __future__ import annotations

import json
import time

import pytest
from labsdk import Lab, NotFoundError
from labsdk._http import HTTPClient
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


def test_a_start_command_runs_from_the_create_until_the_sandbox_is_deleted(live_server, owner):
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    sandbox = lab.sandboxes.create(start_command=["sh", "-c", "echo up; echo $GREETING > /tmp/up; exec sleep 600"],
                                   environment={"GREETING": "hello"})
    waited = lab.sandboxes.run(sandbox.id, "while [ ! -s /tmp/up ]; do sleep 0.05; done; cat /tmp/up", timeout_s=10)
    assert waited.stdout == "hello\n"
    started = lab.sandboxes.background(sandbox.id, "bg_start")
    assert (started.status, started.stdout) == ("running", "up\n")
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


def test_commands_and_files_go_to_the_agent_without_lab(live_server, owner):
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    sandbox = lab.sandboxes.create(timeout_s=120)
    assert sandbox.data_plane is not None and sandbox.data_plane.token.startswith("sbt_")
    lab.sandboxes._http = HTTPClient(base_url="http://127.0.0.1:9/api/v1", token="lab_unreachable", max_retries=0)

    events = list(lab.sandboxes.stream(sandbox.id, "echo one; sleep 0.3; echo two >&2; exit 4"))
    job = lab.sandboxes.start_background(sandbox.id, "sleep 0.5; echo done > /tmp/flag; echo bg")
    assert lab.sandboxes.background(sandbox.id, job.id).status == "running"
    deadline = time.monotonic() + 10
    while (status := lab.sandboxes.background(sandbox.id, job.id)).status == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert lab.sandboxes.upload(sandbox.id, "/tmp/in.txt", b"x") == "/tmp/in.txt"

    assert [(e.type, e.data) for e in events if e.type in ("stdout", "stderr")] == [("stdout", "one\n"), ("stderr", "two\n")]
    assert events[0].type == "started" and events[-1].type == "exit" and events[-1].exit_code == 4
    assert (status.status, status.exit_code, status.stdout) == ("exited", 0, "bg\n")
    assert lab.sandboxes.download(sandbox.id, "/tmp/flag") == b"done\n"


def test_the_sdk_bulk_deletes_by_ids_and_labels_and_reads_logs(live_server, owner, outsider):
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    other = Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0)
    first = lab.sandboxes.create(timeout_s=120)
    batch = [lab.sandboxes.create(timeout_s=120, labels={"run": "7"}) for _ in range(2)]
    kept = lab.sandboxes.create(timeout_s=120)
    lab.sandboxes.run(kept.id, "echo out; echo err >&2")
    lab.sandboxes.run(kept.id, ["python3", "-c", "print(6 * 7)"])

    logs = lab.sandboxes.logs(kept.id)
    foreign = other.sandboxes.bulk_delete([first.id, kept.id])
    result = lab.sandboxes.bulk_delete([first.id, "sbx_" + "0" * 20], labels={"run": "7"})

    assert (logs.sandbox_id, logs.logs, logs.truncated) == (kept.id, "out\nerr\n42\n", False)
    with pytest.raises(NotFoundError):
        other.sandboxes.logs(kept.id)
    assert (foreign.deleted, foreign.not_found) == ([], [first.id, kept.id])
    assert (result.deleted, result.not_found) == ([first.id, batch[1].id, batch[0].id], ["sbx_" + "0" * 20])
    assert [lab.sandboxes.get(s.id).status for s in (first, *batch, kept)] == ["stopped", "stopped", "stopped", "running"]
    assert lab.sandboxes.logs(first.id).logs == ""  # it printed nothing; its (empty) log was kept
    lab.sandboxes.delete(kept.id)
    assert lab.sandboxes.logs(kept.id).logs == "out\nerr\n42\n"


def test_the_cli_deletes_many_by_ids_and_labels_and_prints_logs(live_server, owner, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    named = [lab.sandboxes.create(timeout_s=120).id for _ in range(2)]
    labelled = lab.sandboxes.create(timeout_s=120, labels={"env": "code"}).id
    kept = lab.sandboxes.create(timeout_s=120).id
    lab.sandboxes.run(kept, "echo hello; echo oops >&2")

    assert main(["sandboxes", "logs", kept]) == 0
    assert capsys.readouterr().out == "hello\noops\n"
    assert main(["sandboxes", "delete", *named, "sbx_" + "0" * 20, "--label", "env=code"]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{named[0]} deleted\n{named[1]} deleted\n{labelled} deleted\n"
    assert captured.err == f"sbx_{'0' * 20} not found\n"
    assert main(["sandboxes", "delete"]) == 1
    assert "name sandbox ids" in capsys.readouterr().err
    assert [s.id for s in lab.sandboxes.list() if s.status == "running"] == [kept]
