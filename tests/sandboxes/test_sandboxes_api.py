"""The sandbox REST API (docs/sandboxes.md): create, get, list, delete, bulk delete, logs, data-plane
access (commands and files then go to the session's real agent), the organization's cap under
concurrent creates, tenancy and reaping."""

from __future__ import annotations

import io
import os
import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from jobs.artifacts.lifecycle import sweep_orphans
from lab import storage
from lab.models import AuditLogEntry
from sandboxes import services
from sandboxes.agent import tokens
from sandboxes.agent.sandbox import LOG_BYTES
from sandboxes.kept_logs import expire_kept_logs
from sandboxes.models import Sandbox, SandboxStatus
from sandboxes.runtime.base import RuntimeRefusal
from sandboxes.runtime.local import LocalHost
from tests.support.artifacts import artifact_storage
from tests.support.schema_check import assert_matches, served_document

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("runtime")]

BASE = "/api/v1/sandboxes"


def create(tenant, **body):
    response = tenant.client().post(BASE, body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def data_plane(access: dict) -> httpx.Client:
    """A client of the agent's data plane with the token of ``access`` (a ``data_plane`` body)."""
    return httpx.Client(base_url=access["url"], headers={"Authorization": f"Bearer {access['token']}"}, timeout=60)


@pytest.fixture
def host(agent) -> LocalHost:
    return LocalHost(agent.root)


def test_it_creates_a_running_sandbox_with_its_limits(owner, host, agent):
    body = create(owner, name="grader", cpu_cores=0.5, memory_gb=0.5, disk_gb=0.1, timeout_s=600, labels={"env": "code"}, environment={"SEED": "7"})
    sandbox = Sandbox.objects.unscoped().get()
    access = body.pop("data_plane")
    grant = tokens.verify(agent.secret.encode(), access["token"])
    assert (access["url"], grant.sandbox_id, grant.scope) == (agent.url, sandbox.public_id, "sandbox")
    assert 0 < grant.expires_at - timezone.now().timestamp() <= 900
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
    assert host.workdir(services.sandbox_spec(sandbox)).is_dir()
    assert AuditLogEntry.objects.filter(action="sandbox.create", target=sandbox.public_id).count() == 1
    assert_matches(served_document(), "Sandbox", body | {"data_plane": access})


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
        ({"start_command": ["sleep", 5]}, "start_command", "invalid"),
        ({"start_command": "x" * 200_000}, "start_command", "invalid"),
        ({"privileged": True}, "privileged", "unknown_field"),
    ],
)
def test_it_refuses_bad_input_with_the_field_named(owner, body, param, code):
    response = owner.client().post(BASE, body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"], error["errors"][0]["code"]) == ("invalid_request", param, code)
    assert not Sandbox.objects.unscoped().exists()


@pytest.mark.parametrize("empty", ["", []])
def test_an_empty_start_command_is_none(owner, empty):
    body = create(owner, start_command=empty)

    started = data_plane(body["data_plane"]).get(f"/v1/sandboxes/{body['id']}/background/bg_start")

    assert (started.status_code, started.json()["error"]["code"]) == (404, "not_found")


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


def test_it_deletes_a_sandbox_and_its_files(owner, host):
    body = create(owner)
    sandbox_id = body["id"]
    workdir = host.workdir(services.sandbox_spec(Sandbox.objects.unscoped().get()))
    assert owner.client().delete(f"{BASE}/{sandbox_id}").status_code == 204
    shown = owner.client().get(f"{BASE}/{sandbox_id}").json()
    assert shown["status"] == "stopped" and shown["stopped_at"]
    assert not workdir.exists()
    answer = data_plane(body["data_plane"]).post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": "true"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    refused = owner.client().post(f"{BASE}/{sandbox_id}/auth")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "invalid_state"


def test_auth_gives_a_token_for_the_data_plane_where_commands_and_files_go(owner, agent):
    sandbox_id = create(owner, environment={"GREETING": "hello"})["id"]
    answer = owner.client().post(f"{BASE}/{sandbox_id}/auth")
    assert answer.status_code == 200, answer.content
    access = answer.json()
    assert_matches(served_document(), "SandboxDataPlane", access)
    client = data_plane(access)
    put = client.put(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "src/main.py"}, content=b"import os\nprint(os.environ['GREETING'], 6 * 7)\n")
    assert put.status_code == 200, put.content
    assert put.json() == {"path": "/workspace/src/main.py", "size_bytes": 47}
    result = client.post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": "python3 main.py > out.txt; cat out.txt", "cwd": "src", "timeout_s": 10}).json()
    assert result["stdout"] == "hello 42\n" and result["exit_code"] == 0 and result["timed_out"] is False
    listed = client.post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": ["ls", "/workspace/src"], "env": {"X": "1"}}).json()
    assert listed["stdout"] == "main.py\nout.txt\n"
    got = client.get(f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/workspace/src/out.txt"})
    assert got.status_code == 200 and got.content == b"hello 42\n"
    assert got.headers["content-type"] == "application/octet-stream"


def test_a_command_is_killed_at_its_timeout_and_cannot_outlive_the_sandbox(owner):
    body = create(owner, timeout_s=3)
    client = data_plane(body["data_plane"])
    result = client.post(f"/v1/sandboxes/{body['id']}/commands", json={"command": "sleep 20", "timeout_s": 1}).json()
    assert (result["exit_code"], result["timed_out"]) == (124, True)
    result = client.post(f"/v1/sandboxes/{body['id']}/commands", json={"command": "sleep 30", "timeout_s": 30}).json()
    assert result["timed_out"] is True and result["duration_ms"] < 4000


def _routes(sandbox_id: str):
    yield "get", f"{BASE}/{sandbox_id}", None
    yield "delete", f"{BASE}/{sandbox_id}", None
    yield "post", f"{BASE}/{sandbox_id}/auth", None
    yield "get", f"{BASE}/{sandbox_id}/logs", None


def test_another_organizations_sandbox_is_a_404_on_every_route_like_a_missing_one(owner, outsider, host):
    sandbox_id = create(owner)["id"]
    for method, url, body in _routes(sandbox_id):
        foreign = getattr(outsider.client(), method)(url)
        missing = getattr(owner.client(), method)(url.replace(sandbox_id, "sbx_" + "0" * 20))
        assert foreign.status_code == missing.status_code == 404, (method, url, foreign.content)
        assert foreign.json() == missing.json()
    assert [s["id"] for s in outsider.client().get(BASE).json()["data"]] == []
    sandbox = Sandbox.objects.unscoped().get()
    assert sandbox.status == SandboxStatus.RUNNING
    assert list(host.workdir(services.sandbox_spec(sandbox)).iterdir()) == []


def test_a_read_key_cannot_create_reach_the_data_plane_or_delete(owner):
    from lab.audit import Actor
    from lab.services import api_key_create

    sandbox_id = create(owner)["id"]
    _, key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    client = owner.client(key)
    assert client.get(f"{BASE}/{sandbox_id}").status_code == 200
    assert client.post(BASE, {}, format="json").status_code == 403
    assert client.post(f"{BASE}/{sandbox_id}/auth").status_code == 403
    assert client.delete(f"{BASE}/{sandbox_id}").status_code == 403
    assert client.get(f"{BASE}/{sandbox_id}/logs").status_code == 403
    assert client.post(f"{BASE}/bulk-delete", {"ids": [sandbox_id]}, format="json").status_code == 403
    assert Sandbox.objects.unscoped().get().status == SandboxStatus.RUNNING


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


def test_the_reaper_stops_sandboxes_past_their_lifetime_and_deletes_their_files(owner, host):
    old = create(owner, timeout_s=60)["id"]
    young = create(owner, timeout_s=3600)["id"]
    Sandbox.objects.unscoped().filter(public_id=old).update(created_at=timezone.now() - timedelta(seconds=61))
    assert services.sandbox_reap_expired() == 1
    reaped = Sandbox.objects.unscoped().get(public_id=old)
    assert reaped.status == SandboxStatus.STOPPED
    assert not host.folder(services.sandbox_spec(reaped)).exists()
    assert Sandbox.objects.unscoped().get(public_id=young).status == SandboxStatus.RUNNING
    assert services.sandbox_reap_expired() == 0


# --- bulk delete -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ['a"b', "$.env", "env__contains", "x" * 200, "a'b", "a b"])
def test_a_label_filter_whose_key_no_label_has_lists_none_and_deletes_none(owner, key):
    create(owner, labels={"env": "a"})

    listed = owner.client().get(BASE, {f"label[{key}]": "a"})
    deleted = owner.client().post(f"{BASE}/bulk-delete", {"labels": {key: "a"}}, format="json")

    assert (listed.status_code, listed.json()["data"]) == (200, [])
    assert deleted.status_code in (200, 400), deleted.content
    assert Sandbox.objects.unscoped().get().status == SandboxStatus.RUNNING


def test_bulk_delete_stops_the_ids_named_and_the_active_ones_with_every_label(owner, host):
    named = create(owner)["id"]
    batch = [create(owner, labels={"run": "7", "env": "code"})["id"] for _ in range(2)]
    other_run = create(owner, labels={"run": "8", "env": "code"})["id"]
    missing = "sbx_" + "0" * 20
    folders = {s.public_id: host.folder(services.sandbox_spec(s)) for s in Sandbox.objects.unscoped().all()}

    answer = owner.client().post(f"{BASE}/bulk-delete", {"ids": [named, missing], "labels": {"run": "7", "env": "code"}}, format="json")

    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body == {"object": "sandbox.bulk_delete", "deleted": [named, batch[1], batch[0]], "not_found": [missing]}
    assert_matches(served_document(), "SandboxBulkDeleteResult", body)
    statuses = dict(Sandbox.objects.unscoped().values_list("public_id", "status"))
    assert statuses == {named: "stopped", batch[0]: "stopped", batch[1]: "stopped", other_run: "running"}
    assert [sandbox_id for sandbox_id, folder in folders.items() if folder.exists()] == [other_run]
    deleted = AuditLogEntry.objects.filter(action="sandbox.delete").values_list("target", flat=True)
    assert sorted(deleted) == sorted([named, *batch])


def test_bulk_delete_by_labels_alone_leaves_stopped_ones_out(owner):
    stopped = create(owner, labels={"env": "code"})["id"]
    owner.client().delete(f"{BASE}/{stopped}")
    running = create(owner, labels={"env": "code"})["id"]
    answer = owner.client().post(f"{BASE}/bulk-delete", {"labels": {"env": "code"}}, format="json").json()
    assert (answer["deleted"], answer["not_found"]) == ([running], [])


def test_bulk_delete_treats_another_organizations_ids_as_missing_ones_and_deletes_none(owner, outsider, host):
    theirs = create(outsider, labels={"env": "code"})["id"]
    mine = create(owner, labels={"env": "code"})["id"]
    missing = "sbx_" + "0" * 20

    foreign = owner.client().post(f"{BASE}/bulk-delete", {"ids": [theirs, missing]}, format="json").json()
    by_label = outsider.client().post(f"{BASE}/bulk-delete", {"labels": {"env": "code"}}, format="json").json()

    assert foreign == {"object": "sandbox.bulk_delete", "deleted": [], "not_found": [theirs, missing]}
    assert by_label == {"object": "sandbox.bulk_delete", "deleted": [theirs], "not_found": []}
    assert Sandbox.objects.unscoped().get(public_id=mine).status == SandboxStatus.RUNNING
    assert host.folder(services.sandbox_spec(Sandbox.objects.unscoped().get(public_id=mine))).exists()
    assert not AuditLogEntry.objects.filter(action="sandbox.delete", target=mine).exists()


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "ids", "required"),
        ({"ids": [], "labels": {}}, "ids", "required"),
        ({"ids": "sbx_1"}, "ids", "invalid"),
        ({"ids": [1]}, "ids", "invalid"),
        ({"ids": ["sbx_1"] * 1001}, "ids", "invalid"),
        ({"labels": {"k": 5}}, "labels.k", "invalid"),
        ({"ids": ["sbx_1"], "all": True}, "all", "unknown_field"),
    ],
)
def test_bulk_delete_refuses_a_bad_body_and_deletes_nothing(owner, body, param, code):
    sandbox_id = create(owner)["id"]
    response = owner.client().post(f"{BASE}/bulk-delete", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"], error["errors"][0]["code"]) == ("invalid_request", param, code)
    assert Sandbox.objects.unscoped().get(public_id=sandbox_id).status == SandboxStatus.RUNNING


# --- logs ----------------------------------------------------------------------------------------


def test_logs_are_what_the_sandboxs_commands_printed_and_reading_them_is_audited(owner):
    body = create(owner)
    sandbox_id = body["id"]
    client = data_plane(body["data_plane"])
    client.post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": "echo hello; echo oops >&2; exit 3"})
    client.post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": ["python3", "-c", "print(6 * 7)"]})

    answer = owner.client().get(f"{BASE}/{sandbox_id}/logs")

    assert answer.status_code == 200, answer.content
    assert answer.json() == {"object": "sandbox.logs", "sandbox_id": sandbox_id, "logs": "hello\noops\n42\n", "truncated": False}
    assert_matches(served_document(), "SandboxLogs", answer.json())
    read = AuditLogEntry.objects.get(action="sandbox.read_logs")
    assert (read.target, read.project, read.actor_api_key) == (sandbox_id, owner.project, owner.api_key)


@pytest.mark.usefixtures(artifact_storage.__name__)  # an empty storage: the sweep sees only this test's objects
def test_a_deleted_sandbox_keeps_its_log_which_the_orphan_sweep_leaves_and_an_outsider_cannot_read(owner, outsider):
    body = create(owner)
    sandbox_id = body["id"]
    data_plane(body["data_plane"]).post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": "echo before; echo died >&2; exit 1"})
    assert owner.client().delete(f"{BASE}/{sandbox_id}").status_code == 204

    answer = owner.client().get(f"{BASE}/{sandbox_id}/logs")
    foreign = outsider.client().get(f"{BASE}/{sandbox_id}/logs")
    missing = owner.client().get(f"{BASE}/sbx_{'0' * 20}/logs")

    assert answer.status_code == 200, answer.content
    assert answer.json() == {"object": "sandbox.logs", "sandbox_id": sandbox_id, "logs": "before\ndied\n", "truncated": False}
    assert foreign.status_code == missing.status_code == 404 and foreign.json() == missing.json()
    read = AuditLogEntry.objects.get(action="sandbox.read_logs")
    assert (read.target, read.project, read.actor_api_key) == (sandbox_id, owner.project, owner.api_key)
    key = f"sandboxes/logs/{owner.organization.public_id}/{sandbox_id}.json"
    assert [stored for stored, _ in storage.iter_objects()] == [key]
    assert sweep_orphans(now=timezone.now() + timedelta(days=1)) == 0  # past its grace period: a checkpoint's would go
    assert storage.read_text(key) == '{"logs": "before\\ndied\\n", "truncated": false}'
    assert owner.client().get(f"{BASE}/{sandbox_id}/logs").json()["logs"] == "before\ndied\n"


@pytest.mark.usefixtures(artifact_storage.__name__)  # an empty storage: the sweep sees only this test's objects
def test_kept_logs_go_past_their_retention_and_with_their_sandboxs_row_and_the_route_says_so(owner, settings):
    settings.LAB_SANDBOX_LOG_RETENTION_DAYS = 30
    old, young, orphaned = (create(owner)["id"] for _ in range(3))
    for sandbox_id in (old, young, orphaned):
        assert owner.client().delete(f"{BASE}/{sandbox_id}").status_code == 204
    prefix = f"sandboxes/logs/{owner.organization.public_id}/"
    stranger = "sandboxes/logs/notes.txt"  # not a kept log's key: left alone
    storage.put_stream(stranger, io.BytesIO(b"x"), content_type="text/plain")
    assert expire_kept_logs() == 0

    month_ago = timezone.now() - timedelta(days=31)
    os.utime(storage.path_of(f"{prefix}{old}.json"), (month_ago.timestamp(),) * 2)
    Sandbox.objects.unscoped().filter(public_id=old).update(stopped_at=month_ago)
    Sandbox.objects.unscoped().filter(public_id=orphaned).delete()  # as its project's deletion does

    assert expire_kept_logs() == 2
    assert sorted(key for key, _ in storage.iter_objects("sandboxes/logs/")) == sorted([f"{prefix}{young}.json", stranger])
    gone = owner.client().get(f"{BASE}/{old}/logs")
    assert (gone.status_code, gone.json()["error"]["code"]) == (409, "invalid_state")
    assert gone.json()["error"]["message"] == (
        "The sandbox is stopped: its log was deleted, as every ended sandbox's is 30 days after it ended "
        "(LAB_SANDBOX_LOG_RETENTION_DAYS).")
    assert owner.client().get(f"{BASE}/{young}/logs").status_code == 200
    assert expire_kept_logs(now=timezone.now() + timedelta(days=31)) == 1
    assert [key for key, _ in storage.iter_objects("sandboxes/logs/")] == [stranger]


def test_a_sandbox_its_agent_stopped_at_its_lifetime_keeps_its_log_once_reaped(owner, runtime):
    body = create(owner, timeout_s=2)
    sandbox_id = body["id"]
    data_plane(body["data_plane"]).post(f"/v1/sandboxes/{sandbox_id}/commands", json={"command": "echo last words"})
    spec = services.sandbox_spec(Sandbox.objects.unscoped().get())
    deadline = time.monotonic() + 10
    while sandbox_id in runtime.held()[1] and time.monotonic() < deadline:  # the agent stops it by itself
        time.sleep(0.2)
    assert sandbox_id not in runtime.held()[1]

    assert services.sandbox_reap_expired() == 1

    answer = owner.client().get(f"{BASE}/{sandbox_id}/logs")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["logs"], answer.json()["truncated"]) == ("last words\n", False)
    with pytest.raises(RuntimeRefusal):  # Lab's delete dropped what the agent kept of it
        runtime.logs(spec)


def test_a_kept_log_says_it_was_truncated_as_the_agent_did(owner):
    body = create(owner)
    sandbox_id = body["id"]
    printed = data_plane(body["data_plane"]).post(
        f"/v1/sandboxes/{sandbox_id}/commands", json={"command": ["python3", "-c", "print('x' * 300_000, end='!')"]})
    assert printed.status_code == 200
    owner.client().delete(f"{BASE}/{sandbox_id}")
    kept = owner.client().get(f"{BASE}/{sandbox_id}/logs").json()
    assert (len(kept["logs"]), kept["logs"][-2:], kept["truncated"]) == (LOG_BYTES, "x!", True)


def test_a_sandbox_whose_agent_could_not_give_its_log_ends_anyway_and_says_why_it_has_none(owner, runtime, host):
    sandbox_id = create(owner)["id"]
    sandbox = Sandbox.objects.unscoped().get()
    runtime.destroy(services.sandbox_spec(sandbox))  # gone from the agent before Lab ends it

    assert owner.client().delete(f"{BASE}/{sandbox_id}").status_code == 204

    refused = owner.client().get(f"{BASE}/{sandbox_id}/logs")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "invalid_state")
    assert refused.json()["error"]["message"] == (
        "The sandbox is stopped: its log was not kept (its agent could not give it when the sandbox ended).")
    assert Sandbox.objects.unscoped().get().status == SandboxStatus.STOPPED
    assert not host.folder(services.sandbox_spec(sandbox)).exists()
    assert not list(storage.iter_objects(f"sandboxes/logs/{owner.organization.public_id}/"))
    assert not AuditLogEntry.objects.filter(action="sandbox.read_logs").exists()
