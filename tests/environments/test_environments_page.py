"""The dashboard's environments page: every member sees the list, owners and admins push."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from environments.builds import build_again, build_log_key, latest_build
from environments.models import BuildStatus, EnvironmentPackage
from lab import storage
from tests.support.dashboard import signed_in
from tests.support.environments import push
from tests.support.wheelbuilder import build_wheel

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def upload(wheel):
    filename, data = wheel
    return {"file": SimpleUploadedFile(filename, data, content_type="application/zip")}


def test_it_lets_an_owner_push_and_lists_versions_pusher_and_date(owner, member):
    client = signed_in(owner.user)
    response = client.post("/o/acme/environments/push/", upload(build_wheel("my-env", "0.3.0")))
    assert response.status_code == 201
    assert "Pushed <code>acme/my-env@0.3.0</code>" in response.content.decode()
    package = EnvironmentPackage.objects.unscoped().get()
    assert package.pushed_by == owner.user
    page = signed_in(member).get("/o/acme/environments/").content.decode()
    assert "<code>acme/my-env@0.3.0</code>" in page and "<code>lab/addition</code>" in page
    assert "owner@acme.test" in page and package.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") in page
    assert 'name="file"' not in page  # members do not get the push form


def test_it_refuses_a_push_from_a_plain_member(owner, member):
    response = signed_in(member).post("/o/acme/environments/push/", upload(build_wheel()))
    assert response.status_code == 403
    assert EnvironmentPackage.objects.unscoped().count() == 0


def test_it_shows_why_a_wheel_was_refused(owner):
    response = signed_in(owner.user).post("/o/acme/environments/push/", upload(build_wheel(metadata_version="9.9")))
    assert response.status_code == 400
    assert "METADATA says version &#x27;9.9&#x27;, the file name says &#x27;0.1.0&#x27;" in response.content.decode()
    assert EnvironmentPackage.objects.unscoped().count() == 0


def test_it_is_a_404_for_an_outsider(owner, outsider):
    signed_in(owner.user).post("/o/acme/environments/push/", upload(build_wheel()))
    client = signed_in(outsider.user)
    assert client.get("/o/acme/environments/").status_code == 404
    assert client.post("/o/acme/environments/push/", upload(build_wheel("their-env"))).status_code == 404
    assert EnvironmentPackage.objects.unscoped().count() == 1


def test_it_shows_each_versions_build_status_with_a_link_to_its_log(owner, member, outsider, tmp_path):
    client = signed_in(owner.user)
    for version in ("0.1.0", "0.2.0"):
        assert client.post("/o/acme/environments/push/", upload(build_wheel("my-env", version))).status_code == 201
    failed = latest_build(EnvironmentPackage.objects.unscoped().get(version="0.1.0"))
    log = tmp_path / "build.log"
    log.write_text("[build 12:00:01] resolving 2 requirements\nerror: frobnicator-9000 was not found\n")
    failed.log_key = build_log_key(failed)
    storage.put_file(failed.log_key, log, content_type="text/plain")
    failed.status, failed.error, failed.finished_at = BuildStatus.FAILED, "its requirements cannot be met", timezone.now()
    failed.save()
    rebuilt = build_again(failed.package)  # the latest build is the one shown

    page = signed_in(member).get("/o/acme/environments/").content.decode()
    rows = {row.split("<code>")[1].split("</code>")[0]: row for row in page.split("<tr>")[2:]}
    assert '<span class="build-status build-queued">queued</span>' in rows["acme/my-env@0.1.0"]
    assert '<a href="/o/acme/environments/my-env@0.1.0/build-log/">log</a>' in rows["acme/my-env@0.1.0"]
    assert '<a href="/o/acme/environments/my-env@0.2.0/build-log/">log</a>' in rows["acme/my-env@0.2.0"]
    assert "build-status" not in rows["lab/addition"]
    rebuilt.delete()
    page = signed_in(member).get("/o/acme/environments/").content.decode()
    assert '<span class="build-status build-failed">failed</span>' in page and "its requirements cannot be met" in page

    response = signed_in(member).get("/o/acme/environments/my-env@0.1.0/build-log/")
    assert response.status_code == 200 and response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.decode() == log.read_text()
    assert signed_in(member).get("/o/acme/environments/my-env@0.2.0/build-log/").content == b""  # not run yet
    assert signed_in(member).get("/o/acme/environments/no-such@1.0/build-log/").status_code == 404
    assert signed_in(outsider.user).get("/o/acme/environments/my-env@0.1.0/build-log/").status_code == 404


def test_it_lists_each_versions_arguments_and_names_the_key_that_pushed_it(owner):
    assert push(owner, build_wheel("my-env", "0.3.0")).status_code == 201
    build = latest_build(EnvironmentPackage.objects.unscoped().get())
    build.status = BuildStatus.READY
    build.summary = {"api": "v0", "parameters": [
        {"name": "min_digits", "default": 1, "type": "int", "required": False},
        {"name": "split", "default": "train", "type": "str", "required": False},
        {"name": "tokenizer", "default": None, "type": None, "required": True},
    ]}
    build.save()
    page = signed_in(owner.user).get("/o/acme/environments/").content.decode()
    assert "<code>min_digits=1</code><br><code>split=&quot;train&quot;</code><br><code>tokenizer (required)</code>" in page
    assert "<code>max_operand=" in page  # a built-in's arguments from the catalogue
    key = owner.api_key
    assert f"{key.name} (API key of owner@acme.test)" in page and "api_key:" not in page
