"""``prime env push``, ``list``, ``info``, ``status`` and ``version list`` of ``prime==0.18.0`` against
Lab's Environments Hub routes, the CLI's own code running in this process with every request it
made recorded (tests/support/prime_clients.py): the push builds the wheel of an environment's
directory (``uv build``, offline, with the setuptools this environment has), uploads it to the URL
Lab answers and finalizes it into a version whose build is queued, as ``lab envs push`` does. The
live push, build and training are in test_prime_env_push_live.py."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from environments.builds import latest_build
from environments.models import EnvironmentPackage
from lab.audit import Actor
from lab.services import api_key_create
from tests.support.load_environment_wheels import double_it_dir
from tests.support.prime_clients import prime_cli, prime_http  # noqa: F401

pytestmark = [pytest.mark.django_db]

API = "/prime/api/v1"

def offline_build(monkeypatch) -> None:
    """Let the CLI's ``uv build`` run offline on this interpreter's setuptools (no build isolation)."""
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("UV_NO_BUILD_ISOLATION", "1")
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("VIRTUAL_ENV", str(Path(bin_dir).parent))


def test_prime_env_push_makes_a_lab_version_whose_build_is_queued_and_every_read_shows_it(
    prime_http, owner, outsider, tmp_path, monkeypatch  # noqa: F811
):
    offline_build(monkeypatch)
    folder = double_it_dir(tmp_path)
    monkeypatch.chdir(folder)

    pushed = prime_cli(owner.key, "env", "push")

    assert pushed.exit_code == 0, pushed.output
    assert "Created environment: acme/double-it" in pushed.output
    assert "Successfully pushed acme/double-it" in pushed.output
    package = EnvironmentPackage.objects.unscoped().get()
    assert (package.organization_id, package.public_id, package.kind, package.module) == (
        owner.organization.pk, "acme/double-it@0.1.0", "verifiers", "double_it",
    )
    assert latest_build(package).status == "queued"
    calls = prime_http.calls()
    wheel_id = calls[2][1].rsplit("/", 1)[1]
    version_id = calls[5][1].rsplit("/", 1)[1]
    assert calls == [
        ("POST", f"{API}/environmentshub/resolve"),
        ("POST", f"{API}/environmentshub/acme/double-it/wheels"),
        ("PUT", f"{API}/environmentshub/uploads/{wheel_id}"),
        ("POST", f"{API}/environmentshub/acme/double-it/wheels/{wheel_id}/finalize"),
        ("POST", f"{API}/environmentshub/acme/double-it/versions"),
        ("PUT", f"{API}/environmentshub/uploads/{version_id}"),
        ("POST", f"{API}/environmentshub/acme/double-it/versions/{version_id}/finalize"),
    ]
    assert prime_http.requests[0].body == {"name": "double-it"}
    wheel = prime_http.requests[1].body
    assert (wheel["filename"], wheel["size"], wheel["semantic_version"]) == (package.filename, package.size_bytes, "0.1.0")
    assert wheel["sha256"] == package.sha256 and prime_http.requests[2].body[:2] == b"PK"
    saved = json.loads((folder / ".prime" / ".env-metadata.json").read_text())
    assert (saved["owner"], saved["name"], saved["environment_id"]) == ("acme", "double-it", "acme/double-it")

    listed = prime_cli(owner.key, "env", "list", "--output", "json")
    info = prime_cli(owner.key, "env", "info", "acme/double-it")
    status = prime_cli(owner.key, "env", "status", "acme/double-it", "--output", "json")
    versions = prime_cli(owner.key, "env", "version", "list", "acme/double-it", "--full-hashes")

    assert [result.exit_code for result in (listed, info, status, versions)] == [0] * 4, [listed.output, info.output, status.output, versions.output]
    assert json.loads(listed.output)["environments"] == [{
        "environment": "acme/double-it", "description": package.summary, "visibility": "PRIVATE",
        "version": "0.1.0", "stars": 0, "updated_at": json.loads(listed.output)["environments"][0]["updated_at"],
    }]
    assert "acme/double-it@latest" in info.output and package.summary in info.output
    assert "prime env pull acme/double-it@latest" in info.output  # the CLI's hint for a private environment
    shown = json.loads(status.output)
    assert (shown["id"], shown["latest_version"]["semantic_version"], shown["latest_version"]["content_hash"]) == (
        "acme/double-it@0.1.0", "0.1.0", package.sha256,
    )
    assert shown["build"] == {"status": "queued", "error": None}
    assert "0.1.0" in versions.output and package.sha256 in versions.output and "1 artifact" in versions.output

    # The same version with a change (other bytes, whatever the wheel's timestamps): refused before
    # its upload, with the CLI's own tip; --auto-bump pushes it as the next version.
    with (folder / "double_it.py").open("a") as module:
        module.write("\n# a change after the push\n")
    again = prime_cli(owner.key, "env", "push")
    assert again.exit_code == 1
    assert "Found existing environment: acme/double-it" in again.output
    assert "Failed to prepare wheel upload: HTTP 409: acme/double-it@0.1.0 exists with other bytes" in again.output
    assert "--auto-bump" in again.output
    bumped = prime_cli(owner.key, "env", "push", "--auto-bump")
    assert bumped.exit_code == 0, bumped.output
    assert sorted(EnvironmentPackage.objects.unscoped().values_list("version", flat=True)) == ["0.1.0", "0.1.1"]
    newest = prime_cli(owner.key, "env", "version", "list", "acme/double-it")
    assert newest.output.index("0.1.1") < newest.output.index("0.1.0"), newest.output

    # Another organization: every route is the 404 a missing environment is.
    for argv in (("env", "info", "acme/double-it"), ("env", "status", "acme/double-it"),
                 ("env", "version", "list", "acme/double-it")):
        foreign = prime_cli(outsider.key, *argv)
        assert foreign.exit_code == 1 and "404" in foreign.output, foreign.output
    assert json.loads(prime_cli(outsider.key, "env", "list", "--output", "json").output)["environments"] == []


def test_the_hub_upload_routes_are_scoped_to_their_organization_upload_and_bytes(owner, outsider, tmp_path):
    client, foreign = owner.client(), outsider.client()
    data = b"PK not really a wheel"
    announced = {"filename": "double_it-0.1.0-py3-none-any.whl", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    started = client.post(f"{API}/environmentshub/acme/double-it/wheels", announced, format="json")
    assert started.status_code == 200, started.content
    upload_id, upload_url = started.json()["data"]["wheel_id"], started.json()["data"]["upload_url"]
    assert upload_url == f"http://testserver{API}/environmentshub/uploads/{upload_id}"
    anonymous = type(client)()

    # The upload URL takes the announced bytes only, and no key; a forged id is a 404.
    other = anonymous.put(f"{API}/environmentshub/uploads/{upload_id}", b"other bytes", content_type="application/octet-stream")
    forged = anonymous.put(f"{API}/environmentshub/uploads/{upload_id[:-2]}xx", data, content_type="application/octet-stream")
    assert (other.status_code, forged.status_code) == (400, 404)
    assert "not the file announced" in other.json()["detail"] and forged.json() == {"detail": "No such upload."}

    # Another organization cannot finalize it, start an upload into acme's name, or read it.
    assert foreign.post(f"{API}/environmentshub/acme/double-it/wheels/{upload_id}/finalize").status_code == 404
    assert foreign.post(f"{API}/environmentshub/globex/double-it/wheels/{upload_id}/finalize").status_code == 404
    assert foreign.post(f"{API}/environmentshub/acme/double-it/wheels", announced, format="json").status_code == 404
    assert foreign.post(f"{API}/environmentshub/acme/double-it/versions", {"semantic_version": "0.1.0"}, format="json").status_code == 404
    assert foreign.get(f"{API}/environmentshub/acme/double-it/status").status_code == 404
    assert foreign.get(f"{API}/environmentshub/acme/double-it/versions").status_code == 404

    # Finalizing before the upload arrived is a 409, and nothing is pushed.
    early = client.post(f"{API}/environmentshub/acme/double-it/wheels/{upload_id}/finalize")
    assert early.status_code == 409 and "PUT it to the upload_url first" in early.json()["detail"]
    # A wheel of another project than the environment pushed is refused before any upload.
    wrong = client.post(f"{API}/environmentshub/acme/double-it/wheels", {**announced, "filename": "other-0.1.0-py3-none-any.whl"}, format="json")
    assert wrong.status_code == 400 and "not of the environment 'double-it'" in wrong.json()["detail"]
    # A source archive of a version no wheel made is a 409 naming the fix.
    source = client.post(f"{API}/environmentshub/acme/double-it/versions", {"semantic_version": "9.9.9", "sha256": "0" * 64, "filename": "s.tar.gz"}, format="json")
    assert source.status_code == 409 and "push its wheel first" in source.json()["detail"]

    # The hub's features Lab does not serve answer a JSON 404 saying what it serves.
    for method, path in (("get", "acme/double-it/secrets"), ("delete", "acme/double-it"), ("get", "acme/double-it/@latest/inspect")):
        refused = getattr(client, method)(f"{API}/environmentshub/{path}")
        assert refused.status_code == 404 and "serves push, list, info, status and version list only" in refused.json()["detail"]

    # The upload URL takes more than the API's 1 MB; finalizing bytes that are no wheel is Lab's 400.
    large = b"PK" + b"x" * (2 * 1024 * 1024)
    started = client.post(
        f"{API}/environmentshub/acme/double-it/wheels",
        {**announced, "size": len(large), "sha256": hashlib.sha256(large).hexdigest()}, format="json",
    ).json()["data"]
    stored = anonymous.put(f"{API}/environmentshub/uploads/{started['wheel_id']}", large, content_type="application/octet-stream")
    assert stored.status_code == 200 and stored.json()["size"] == len(large)
    refused = client.post(f"{API}/environmentshub/acme/double-it/wheels/{started['wheel_id']}/finalize")
    assert refused.status_code == 400 and "Not an acceptable environment wheel" in refused.json()["detail"]

    _, reader = api_key_create(actor=Actor(user=owner.user), project=owner.project, name="read", scopes=["read"])
    read_only = owner.client(reader)
    assert read_only.post(f"{API}/environmentshub/acme/double-it/wheels", announced, format="json").status_code == 403
    assert EnvironmentPackage.objects.unscoped().count() == 0


def test_a_staged_wheel_never_finalized_is_deleted_once_its_ticket_expired_and_a_young_one_is_kept(owner, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from environments.hub import STAGED_MAX_AGE, STAGING_PREFIX, UploadTicket
    from environments.tasks import sweep_environment_builds
    from lab import storage

    client, anonymous = owner.client(), owner.client().__class__()
    staged = []
    for data in (b"PK abandoned", b"PK young"):
        announced = {"filename": "double_it-0.1.0-py3-none-any.whl", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        upload_id = client.post(f"{API}/environmentshub/acme/double-it/wheels", announced, format="json").json()["data"]["wheel_id"]
        assert anonymous.put(f"{API}/environmentshub/uploads/{upload_id}", data, content_type="application/octet-stream").status_code == 200
        staged.append(UploadTicket.read(upload_id).staging_key)
    assert all(key.startswith(STAGING_PREFIX) for key in staged)
    assert set(staged) <= {key for key, _ in storage.iter_objects(STAGING_PREFIX)}

    old = (timezone.now() - STAGED_MAX_AGE - timedelta(minutes=1)).timestamp()
    os.utime(storage.path_of(staged[0]), (old, old))  # uploaded past its ticket's life
    assert sweep_environment_builds()["staged_deleted"] >= 1
    left = {key for key, _ in storage.iter_objects(STAGING_PREFIX)}
    assert staged[0] not in left and staged[1] in left
    assert sweep_environment_builds()["staged_deleted"] == 0
