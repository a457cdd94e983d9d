"""The sandbox REST API (docs/sandboxes.md): create, get, list, delete, commands and files, the
organization's cap under concurrent creates, tenancy and reaping."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from lab.models import AuditLogEntry
from sandboxes import services
from sandboxes.models import Sandbox, SandboxStatus
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("runtime")]

BASE = "/api/v1/sandboxes"


def create(tenant, **body):
    response = tenant.client().post(BASE, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_it_creates_a_running_sandbox_with_its_limits(owner, runtime):
    body = create(owner, name="grader", cpu_cores=0.5, memory_gb=0.5, disk_gb=0.1, timeout_s=600, labels={"env": "code"}, environment={"SEED": "7"})
    sandbox = Sandbox.objects.unscoped().get()
    assert body == {
        "id": sandbox.public_id,
        "object": "sandbox",
        "name": "grader",
        "status": "running",
        "image": "python:3.11",
        "cpu_cores": 0.5,
        "memory_gb": 0.5,
        "disk_gb": 0.1,
        "timeout_s": 600,
        "network": "none",
        "environment_names": ["SEED"],
        "labels": {"env": "code"},
        "job_id": None,
        "error": None,
        "created_at": body["created_at"],
        "started_at": body["started_at"],
        "stopped_at": None,
        "warnings": [],
    }
    assert body["id"].startswith("sbx_")
    assert sandbox.project == owner.project and sandbox.organization == owner.organization
    assert runtime.workdir(services.sandbox_spec(sandbox)).is_dir()
    assert AuditLogEntry.objects.filter(action="sandbox.create", target=sandbox.public_id).count() == 1
    assert_matches(served_document(), "Sandbox", body)


def test_it_maps_python_3_11_slim_to_its_python_image_with_a_warning(owner):
    body = create(owner, docker_image="python:3.11-slim")
    assert body["image"] == "python:3.11"
    assert body["warnings"] == ["image 'python:3.11-slim' runs as 'python:3.11', the Python 3.11 image this Lab provides."]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"image": "ubuntu:24.04"}, "image", "unknown_image"),
        ({"cpu_cores": 64}, "cpu_cores", "out_of_range"),
        ({"memory_gb": "1"}, "memory_gb", "invalid"),
        ({"timeout_s": 1.5}, "timeout_s", "invalid"),
        ({"network": "egress"}, "network", "egress_not_allowed"),
        ({"network": "host"}, "network", "invalid"),
        ({"environment": {"1BAD": "x"}}, "environment.1BAD", "invalid"),
        ({"labels": {"k": 5}}, "labels.k", "invalid"),
        ({"privileged": True}, "privileged", "unknown_field"),
    ],
)
def test_it_refuses_bad_input_with_the_field_named(owner, body, param, code):
    response = owner.client().post(BASE, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"], error["errors"][0]["code"]) == ("invalid_request", param, code)
    assert not Sandbox.objects.unscoped().exists()


def test_it_lists_newest_first_by_label_with_a_cursor(owner):
    first = create(owner, labels={"env": "a"})["id"]
    second = create(owner, labels={"env": "b"})["id"]
    third = create(owner, labels={"env": "a", "run": "1"})["id"]
    client = owner.client()
    assert [s["id"] for s in client.get(BASE).json()["data"]] == [third, second, first]
    assert [s["id"] for s in client.get(BASE, {"label[env]": "a"}).json()["data"]] == [third, first]
    page = client.get(BASE, {"limit": 1, "after": third}).json()
    assert [s["id"] for s in page["data"]] == [second] and page["has_more"] is True
    assert_matches(served_document(), "SandboxList", client.get(BASE).json())


def test_it_deletes_a_sandbox_and_its_files(owner, runtime):
    sandbox_id = create(owner)["id"]
    workdir = runtime.workdir(services.sandbox_spec(Sandbox.objects.unscoped().get()))
    assert owner.client().delete(f"{BASE}/{sandbox_id}").status_code == 204
    shown = owner.client().get(f"{BASE}/{sandbox_id}").json()
    assert shown["status"] == "stopped" and shown["stopped_at"]
    assert not workdir.exists()
    answer = owner.client().post(f"{BASE}/{sandbox_id}/commands", {"command": "true"}, format="json")
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "invalid_state"


def test_it_runs_a_command_and_moves_files(owner):
    sandbox_id = create(owner, environment={"GREETING": "hello"})["id"]
    client = owner.client()
    put = client.put(f"{BASE}/{sandbox_id}/files?path=src/main.py", data=b"import os\nprint(os.environ['GREETING'], 6 * 7)\n", content_type="application/octet-stream")
    assert put.status_code == 200, put.content
    assert put.json() == {"path": "/workspace/src/main.py", "size_bytes": 47}
    result = client.post(f"{BASE}/{sandbox_id}/commands", {"command": "python3 main.py > out.txt; cat out.txt", "cwd": "src", "timeout_s": 10}, format="json").json()
    assert result["stdout"] == "hello 42\n" and result["exit_code"] == 0 and result["timed_out"] is False
    assert_matches(served_document(), "SandboxCommandResult", result)
    listed = client.post(f"{BASE}/{sandbox_id}/commands", {"command": ["ls", "/workspace/src"], "env": {"X": "1"}}, format="json").json()
    assert listed["stdout"] == "main.py\nout.txt\n"
    got = client.get(f"{BASE}/{sandbox_id}/files", {"path": "/workspace/src/out.txt"})
    assert got.status_code == 200 and got.content == b"hello 42\n"
    assert got["Content-Type"] == "application/octet-stream"


def test_it_kills_a_command_at_its_timeout_through_the_api(owner):
    sandbox_id = create(owner)["id"]
    result = owner.client().post(f"{BASE}/{sandbox_id}/commands", {"command": "sleep 20", "timeout_s": 1}, format="json").json()
    assert (result["exit_code"], result["timed_out"]) == (124, True)
    assert result["duration_ms"] < 5000


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "/workspace/../x"])
def test_it_refuses_file_paths_outside_the_workspace(owner, path):
    sandbox_id = create(owner)["id"]
    client = owner.client()
    put = client.put(f"{BASE}/{sandbox_id}/files?path={path}", data=b"x", content_type="application/octet-stream")
    got = client.get(f"{BASE}/{sandbox_id}/files", {"path": path})
    for answer in (put, got):
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"]["param"] == "path"
        assert answer.json()["error"]["errors"][0]["code"] == "invalid_path"


def test_it_refuses_a_symlink_that_escapes_the_workspace(owner, tmp_path):
    outside = tmp_path / "host.txt"
    outside.write_text("host")
    sandbox_id = create(owner)["id"]
    client = owner.client()
    client.post(f"{BASE}/{sandbox_id}/commands", {"command": f"ln -s {outside} escape; ln -s / root"}, format="json")
    for path in ("escape", "root/etc/passwd"):
        got = client.get(f"{BASE}/{sandbox_id}/files", {"path": path})
        put = client.put(f"{BASE}/{sandbox_id}/files?path={path}", data=b"overwritten", content_type="application/octet-stream")
        assert (got.status_code, put.status_code) == (400, 400), (got.content, put.content)
    assert outside.read_text() == "host"


def _routes(sandbox_id: str):
    yield "get", f"{BASE}/{sandbox_id}", None
    yield "delete", f"{BASE}/{sandbox_id}", None
    yield "post", f"{BASE}/{sandbox_id}/commands", {"command": "touch pwned"}
    yield "put", f"{BASE}/{sandbox_id}/files?path=pwned", b"x"
    yield "get", f"{BASE}/{sandbox_id}/files?path=pwned", None


def test_another_organizations_sandbox_is_a_404_on_every_route_like_a_missing_one(owner, outsider, runtime):
    sandbox_id = create(owner)["id"]
    for method, url, body in _routes(sandbox_id):
        kwargs = {"format": "json"} if isinstance(body, dict) else {"content_type": "application/octet-stream"}
        foreign = getattr(outsider.client(), method)(url, body, **kwargs) if body is not None else getattr(outsider.client(), method)(url)
        missing_url = url.replace(sandbox_id, "sbx_" + "0" * 20)
        missing = getattr(owner.client(), method)(missing_url, body, **kwargs) if body is not None else getattr(owner.client(), method)(missing_url)
        assert foreign.status_code == missing.status_code == 404, (method, url, foreign.content)
        assert foreign.json() == missing.json()
    assert [s["id"] for s in outsider.client().get(BASE).json()["data"]] == []
    sandbox = Sandbox.objects.unscoped().get()
    assert sandbox.status == SandboxStatus.RUNNING
    assert list(runtime.workdir(services.sandbox_spec(sandbox)).iterdir()) == []


def test_a_read_key_cannot_create_run_or_write(owner):
    from lab.audit import Actor
    from lab.services import api_key_create

    sandbox_id = create(owner)["id"]
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    client = owner.client(key)
    assert client.get(f"{BASE}/{sandbox_id}").status_code == 200
    assert client.post(BASE, {}, format="json").status_code == 403
    assert client.post(f"{BASE}/{sandbox_id}/commands", {"command": "true"}, format="json").status_code == 403
    assert client.delete(f"{BASE}/{sandbox_id}").status_code == 403


def test_it_refuses_a_sandbox_past_the_organizations_cap(owner, settings):
    settings.LAB_SANDBOX_MAX_PER_ORG = 2
    first = create(owner)["id"]
    create(owner)
    refused = owner.client().post(BASE, {}, format="json")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    assert 3595 <= int(refused["Retry-After"]) <= 3600  # when the first one's lifetime (3600 s) ends
    assert Sandbox.objects.unscoped().count() == 2
    owner.client().delete(f"{BASE}/{first}")
    create(owner)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
def test_the_cap_holds_under_concurrent_creates(owner, settings, monkeypatch):
    settings.LAB_SANDBOX_MAX_PER_ORG = 3
    original = Sandbox.objects.create

    def slow_create(**fields):  # widen the window between counting and inserting
        threading.Event().wait(0.2)
        return original(**fields)

    monkeypatch.setattr(Sandbox.objects, "create", slow_create)
    barrier = threading.Barrier(8)
    statuses: list[int] = []

    def attempt():
        try:
            barrier.wait()
            statuses.append(owner.client().post(BASE, {}, format="json").status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [201] * 3 + [429] * 5
    assert Sandbox.objects.unscoped().filter(organization=owner.organization).count() == 3


def test_the_reaper_stops_sandboxes_past_their_lifetime_and_deletes_their_files(owner, runtime):
    old = create(owner, timeout_s=60)["id"]
    young = create(owner, timeout_s=3600)["id"]
    Sandbox.objects.unscoped().filter(public_id=old).update(created_at=timezone.now() - timedelta(seconds=61))
    assert services.sandbox_reap_expired() == 1
    reaped = Sandbox.objects.unscoped().get(public_id=old)
    assert reaped.status == SandboxStatus.STOPPED
    assert not runtime.workdir(services.sandbox_spec(reaped)).exists()
    assert Sandbox.objects.unscoped().get(public_id=young).status == SandboxStatus.RUNNING
    assert services.sandbox_reap_expired() == 0


def test_a_command_cannot_outlive_the_sandbox(owner):
    sandbox_id = create(owner, timeout_s=60)["id"]
    Sandbox.objects.unscoped().filter(public_id=sandbox_id).update(created_at=timezone.now() - timedelta(seconds=59))
    result = owner.client().post(f"{BASE}/{sandbox_id}/commands", {"command": "sleep 30", "timeout_s": 30}, format="json").json()
    assert result["timed_out"] is True and result["duration_ms"] < 5000
