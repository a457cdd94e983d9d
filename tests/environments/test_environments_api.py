"""Environment packages over the REST API: push, list, get, resolve @latest, immutability,
delete (refused while a job uses it), tenancy, hostile uploads, and never running their code."""

from __future__ import annotations

import os
import sys

import pytest

from environments.models import EnvironmentPackage
from jobs.environment_packages import launch_packages
from jobs.models import Job
from lab import storage
from lab.audit import Actor
from lab.models import AuditLogEntry
from lab.services import api_key_create
from tests.support.environments import push, stored_keys
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

BUILTINS = ["lab/addition", "lab/reverse-text", "lab/alphabet-sort", "lab/python-code"]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    """An empty storage per test, so every stored object seen is this test's."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def test_it_pushes_a_wheel_and_answers_the_environment_object(owner):
    filename, data = build_wheel("my-env", "0.1.0")
    response = push(owner, (filename, data))
    assert response.status_code == 201, response.content
    body = response.json()
    package = EnvironmentPackage.objects.unscoped().get()
    assert body == {
        "id": "acme/my-env@0.1.0",
        "object": "environment",
        "kind": "verifiers",
        "name": "my-env",
        "version": "0.1.0",
        "sha256": package.sha256,
        "size_bytes": len(data),
        "created_at": package.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "description": "a test environment",
        "args": {},
        "entry_point": "my_env",
        "dependencies": ["verifiers>=0.4.0"],
        "verifiers_version": ">=0.4.0",
        "pushed_by": f"api_key:{owner.api_key.public_id}",
        "build": body["build"],
    }
    assert (body["build"]["number"], body["build"]["status"]) == (1, "queued")  # built by a worker (tests/environments/test_builds.py)
    import hashlib

    assert package.sha256 == hashlib.sha256(data).hexdigest()
    assert stored_keys() == [package.storage_key]
    assert storage.open_object(package.storage_key).read() == data
    assert AuditLogEntry.objects.filter(action="environment.push", target="acme/my-env@0.1.0").count() == 1


def test_it_lists_built_ins_and_the_organizations_packages_newest_version_first(owner, outsider):
    for version in ("0.1.0", "0.10.0", "0.2.0"):
        assert push(owner, build_wheel("my-env", version)).status_code == 201
    assert push(outsider, build_wheel("their-env", "1.0")).status_code == 201
    body = owner.client().get("/api/v1/environments").json()
    assert body["object"] == "list" and body["has_more"] is False
    assert [item["id"] for item in body["data"]] == [*BUILTINS, "acme/my-env@0.10.0", "acme/my-env@0.2.0", "acme/my-env@0.1.0"]
    builtin = body["data"][0]
    assert (builtin["kind"], builtin["version"], builtin["sha256"]) == ("builtin", None, None)


def test_a_built_in_has_no_build_log_no_rebuild_and_no_delete_and_says_so(owner):
    client = owner.client()
    answers = {
        "build-log": client.get(f"/api/v1/environments/{BUILTINS[0]}/build-log"),
        "rebuild": client.post(f"/api/v1/environments/{BUILTINS[0]}/builds"),
        "delete": client.delete(f"/api/v1/environments/{BUILTINS[0]}@latest"),
    }
    for action, answer in answers.items():
        assert answer.status_code == 400, (action, answer.content)
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_request", "name")
        assert error["message"].startswith(f"{BUILTINS[0]} is one of Lab's built-in environments, part of the engine: it ")
    assert "cannot be deleted" in answers["delete"].json()["error"]["message"]
    assert client.get(f"/api/v1/environments/{BUILTINS[0]}").status_code == 200
    assert AuditLogEntry.objects.filter(action="environment.delete").count() == 0


def test_the_list_pages_with_limit_and_after_like_every_list(owner, outsider):
    for version in ("0.1.0", "0.2.0", "0.3.0"):
        assert push(owner, build_wheel("my-env", version)).status_code == 201
    assert push(outsider, build_wheel("their-env", "1.0")).status_code == 201
    client = owner.client()
    first = client.get("/api/v1/environments", {"limit": len(BUILTINS) + 1}).json()
    second = client.get("/api/v1/environments", {"limit": len(BUILTINS) + 1, "after": first["data"][-1]["id"]}).json()
    assert ([item["id"] for item in first["data"]], first["has_more"]) == ([*BUILTINS, "acme/my-env@0.3.0"], True)
    assert ([item["id"] for item in second["data"]], second["has_more"]) == (["acme/my-env@0.2.0", "acme/my-env@0.1.0"], False)
    # A cursor the caller cannot see (another organization's package, or none) is a 404, as a missing id.
    for after in ("globex/their-env@1.0", "acme/none@9"):
        refused = client.get("/api/v1/environments", {"after": after})
        assert (refused.status_code, refused.json()["error"]["code"]) == (404, "not_found")
    assert client.get("/api/v1/environments", {"limit": 101}).status_code == 400


def test_it_resolves_a_missing_version_and_latest_to_the_highest_one(owner):
    for version in ("0.9.0", "0.10.0"):
        push(owner, build_wheel("my-env", version))
    client = owner.client()
    assert client.get("/api/v1/environments/acme/my-env").json()["id"] == "acme/my-env@0.10.0"
    assert client.get("/api/v1/environments/acme/my-env@latest").json()["id"] == "acme/my-env@0.10.0"
    assert client.get("/api/v1/environments/acme/My_Env@0.9.0").json()["id"] == "acme/my-env@0.9.0"
    assert client.get("/api/v1/environments/acme/my-env@0.3.0").status_code == 404


def test_it_answers_the_same_bytes_again_with_the_same_object(owner):
    wheel = build_wheel()
    first = push(owner, wheel)
    again = push(owner, wheel)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert EnvironmentPackage.objects.unscoped().count() == 1


def test_it_refuses_the_same_version_with_other_bytes(owner):
    push(owner, build_wheel())
    keys = stored_keys()
    response = push(owner, build_wheel(files={"my_env/__init__.py": "__all__ = []\n"}))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "invalid_state"
    assert "versions are immutable" in response.json()["error"]["message"]
    assert stored_keys() == keys
    assert EnvironmentPackage.objects.unscoped().count() == 1


def test_it_never_reuses_a_deleted_version(owner, django_capture_on_commit_callbacks):
    wheel = build_wheel()
    push(owner, wheel)
    with django_capture_on_commit_callbacks(execute=True):
        assert owner.client().delete("/api/v1/environments/acme/my-env@0.1.0").status_code == 204
    assert stored_keys() == []
    for again in (wheel, build_wheel(files={"my_env/__init__.py": "__all__ = []\n"})):
        response = push(owner, again)
        assert response.status_code == 409
        assert "was deleted; versions are never reused" in response.json()["error"]["message"]
    assert stored_keys() == []
    assert owner.client().get("/api/v1/environments/acme/my-env").status_code == 404
    assert [item["id"] for item in owner.client().get("/api/v1/environments").json()["data"]] == BUILTINS


def test_it_deletes_the_latest_version_when_none_is_named(owner):
    push(owner, build_wheel("my-env", "0.1.0"))
    push(owner, build_wheel("my-env", "0.2.0"))
    assert owner.client().delete("/api/v1/environments/acme/my-env").status_code == 204
    assert owner.client().get("/api/v1/environments/acme/my-env").json()["id"] == "acme/my-env@0.1.0"
    assert AuditLogEntry.objects.filter(action="environment.delete", target="acme/my-env@0.2.0").count() == 1


def test_it_hides_another_organizations_package_like_a_missing_one(owner, outsider):
    push(owner, build_wheel())
    client = outsider.client()
    for path in ("/api/v1/environments/acme/my-env", "/api/v1/environments/acme/my-env@0.1.0"):
        foreign, missing = client.get(path), client.get("/api/v1/environments/acme/nothing")
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json() == missing.json()
        assert client.delete(path).json() == client.delete("/api/v1/environments/acme/nothing").json()
    assert EnvironmentPackage.objects.unscoped().get().deleted_at is None
    assert [item["id"] for item in client.get("/api/v1/environments").json()["data"]] == BUILTINS


def test_it_refuses_a_push_from_a_read_only_key(owner):
    _, read_key = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="ro", scopes=["read"])
    response = push(owner, build_wheel(), key=read_key)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "insufficient_scope"
    assert EnvironmentPackage.objects.unscoped().count() == 0


@pytest.mark.parametrize(
    "wheel",
    [
        ("evil.txt", b"hello"),
        ("my_env-0.1.0-py3-none-any.whl", b"PK\x03\x04 not really"),
        build_wheel(extra_members=[("../../escape.py", b"x = 1\n")]),
        build_wheel(metadata_version="9.9.9"),
        build_wheel(extra_members=[("my_env/zeros.bin", b"\0" * (30 * 1024 * 1024))]),
    ],
    ids=["not-a-wheel", "not-a-zip", "traversal", "lying-metadata", "zip-bomb"],
)
def test_it_refuses_hostile_uploads_with_a_clear_400_and_stores_nothing(owner, wheel):
    response = push(owner, wheel)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_environment_package", "file")
    assert error["message"].startswith("Not an acceptable environment wheel: ")
    assert EnvironmentPackage.objects.unscoped().count() == 0
    assert stored_keys() == []


def test_it_refuses_a_request_without_the_file_field(owner):
    response = owner.client().post("/api/v1/environments", {"other": "x"}, format="multipart")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "file"


def test_it_refuses_wheels_over_the_limit_with_413(owner, monkeypatch, settings):
    from environments import services

    monkeypatch.setattr(services, "MAX_WHEEL_BYTES", 1000)
    response = push(owner, build_wheel(files={"my_env/__init__.py": "# " + os.urandom(4000).hex()}))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    settings.LAB_MAX_UPLOAD_REQUEST_BYTES = 2000
    response = push(owner, build_wheel(files={"my_env/__init__.py": "# " + os.urandom(4000).hex()}))
    assert response.status_code == 413
    assert EnvironmentPackage.objects.unscoped().count() == 0 and stored_keys() == []


def test_it_accepts_an_upload_beyond_the_json_body_limit(owner):
    text = os.urandom(1024 * 1024).hex()  # 2 MB of hex digits: more than 1 MB compressed
    response = push(owner, build_wheel(files={"my_env/__init__.py": "", "my_env/data.txt": text}))
    assert response.status_code == 201, response.content
    assert response.json()["size_bytes"] > 1024 * 1024


def test_it_never_imports_an_uploaded_package_on_the_server(owner, spec, tmp_path):
    marker = tmp_path / "imported"
    source = f"open({str(marker)!r}, 'w').write('ran')\n__all__ = []\n"
    response = push(owner, build_wheel("trap-env", "1.0", files={"trap_env/__init__.py": source}))
    assert response.status_code == 201
    client = owner.client()
    client.get("/api/v1/environments")
    client.get("/api/v1/environments/acme/trap-env")
    spec["env"] = [{"id": "acme/trap-env"}]
    assert client.post("/api/v1/jobs", spec, format="json").status_code == 201
    assert client.post("/api/v1/jobs/estimate", spec, format="json").status_code == 200
    launch_packages(Job.objects.unscoped().get())
    assert not marker.exists()
    assert "trap_env" not in sys.modules


def test_it_stores_the_resolved_version_in_the_job(owner, spec):
    push(owner, build_wheel("my-env", "0.1.0"))
    push(owner, build_wheel("my-env", "0.2.0"))
    spec["env"] = [{"id": "acme/my-env", "args": {"anything": [1, 2]}}, {"id": "acme/my-env@0.1.0"}, {"id": "lab/addition"}]
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 201, response.content
    assert [env["id"] for env in response.json()["spec"]["env"]] == ["acme/my-env@0.2.0", "acme/my-env@0.1.0", "lab/addition"]
    job = Job.objects.unscoped().get()
    packages = launch_packages(job)
    assert sorted(package["id"] for package in packages) == ["acme/my-env@0.1.0", "acme/my-env@0.2.0"]
    for package in packages:
        row = EnvironmentPackage.objects.unscoped().get(version=package["id"].rsplit("@")[1])
        assert package["sha256"] == row.sha256
        assert package["url"] == storage.path_of(row.storage_key).as_uri()


def test_an_uploaded_eval_environment_is_resolved_installed_and_kept_from_deletion_like_a_training_one(owner, outsider, spec):
    push(owner, build_wheel("my-env", "0.1.0"))
    push(owner, build_wheel("my-env", "0.2.0"))
    push(outsider, build_wheel("their-env", "1.0"))
    spec["eval"] = {"interval": 1, "env": [{"id": "acme/my-env", "num_examples": 2}]}
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["eval"]["env"][0]["id"] == "acme/my-env@0.2.0"  # resolved at submit
    job = Job.objects.unscoped().get()
    assert [package["id"] for package in launch_packages(job)] == ["acme/my-env@0.2.0"]  # the engine installs it
    deleted = owner.client().delete("/api/v1/environments/acme/my-env@0.2.0")
    assert deleted.status_code == 409 and job.public_id in deleted.json()["error"]["message"]
    spec["eval"]["env"][0]["id"] = "globex/their-env"
    refused = owner.client().post("/api/v1/jobs", spec, format="json")
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "eval.env.0.id")
    assert Job.objects.unscoped().count() == 1


def test_it_refuses_another_organizations_id_at_submit_like_a_missing_one(owner, outsider, spec):
    push(outsider, build_wheel("their-env", "1.0"))
    push(owner, build_wheel("my-env", "0.1.0"))
    answers = []
    for env_id in ("globex/their-env", "globex/their-env@1.0", "globex/nothing"):
        spec["env"] = [{"id": env_id}]
        response = owner.client().post("/api/v1/jobs", spec, format="json")
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_spec", "env.0.id")
        answers.append(error["message"].replace(env_id, "<id>"))
    assert answers[0] == answers[1] == answers[2]
    assert "acme/my-env@0.1.0" in answers[0] and "lab/addition" in answers[0] and "globex" not in answers[0]
    assert Job.objects.unscoped().count() == 0


def test_it_refuses_to_delete_a_package_a_queued_job_uses(owner, spec):
    push(owner, build_wheel())
    spec["env"] = [{"id": "acme/my-env@latest"}]
    job_id = owner.client().post("/api/v1/jobs", spec, format="json").json()["id"]
    response = owner.client().delete("/api/v1/environments/acme/my-env")
    assert response.status_code == 409
    assert job_id in response.json()["error"]["message"]
    assert EnvironmentPackage.objects.unscoped().get().deleted_at is None and len(stored_keys()) == 1
    assert owner.client().post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    assert owner.client().delete("/api/v1/environments/acme/my-env").status_code == 204
    spec["env"] = [{"id": "acme/my-env@0.1.0"}]
    response = owner.client().post("/api/v1/jobs", spec, format="json")
    assert (response.status_code, response.json()["error"]["param"]) == (400, "env.0.id")


def test_a_built_in_id_keeps_meaning_the_built_in_for_an_organization_slugged_lab(db, spec):
    from lab.models import Organization
    from tests.conftest import make_tenant

    lab = make_tenant("owner@lab.test", "Lab")
    # an organization slugged "lab" before the slug was reserved (lab.services.reserved_organization_slugs)
    Organization.objects.filter(pk=lab.organization.pk).update(slug="lab")
    assert push(lab, build_wheel("addition", "1.0")).status_code == 201
    spec["env"] = [{"id": "lab/addition", "args": {"colour": "red"}}]
    response = lab.client().post("/api/v1/jobs", spec, format="json")
    assert (response.status_code, response.json()["error"]["param"]) == (400, "env.0.args.colour")
    spec["env"] = [{"id": "lab/addition@1.0"}]
    assert lab.client().post("/api/v1/jobs", spec, format="json").json()["spec"]["env"][0]["id"] == "lab/addition@1.0"
