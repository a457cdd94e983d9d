"""Which versions and names an environment push may carry: a version equal under PEP 440 to one
already pushed (``0.1`` beside ``0.1.0``, with other bytes) is the same version, refused with 409
(two were stored, and ``@latest`` picked either); a package name that is not ASCII is not PEP
508's, refused with 400 (``ſum`` and a METADATA name with the Kelvin sign were stored)."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection

from environments.models import EnvironmentPackage
from environments.services import environment_push
from lab import storage
from lab.api.errors import http_status
from lab.audit import Actor
from lab.errors import LabError
from tests.support.wheelbuilder import build_wheel

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    """An empty storage per test, so every stored object seen is this test's."""
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def push(tenant, wheel):
    filename, data = wheel
    return tenant.client().post(
        "/api/v1/environments", {"file": SimpleUploadedFile(filename, data, content_type="application/zip")}, format="multipart"
    )


def stored_keys() -> list[str]:
    return sorted(key for key, _ in storage.iter_objects())


def rows() -> list[tuple[str, str]]:
    return sorted(EnvironmentPackage.objects.unscoped().values_list("name", "version"))


@pytest.mark.parametrize(("first", "second"), [("0.1.0", "0.1"), ("0.1", "0.1.0"), ("1.0", "1.0.0.0"), ("2", "2.0")])
def test_a_version_equal_under_pep_440_to_a_pushed_one_is_a_409_that_stores_nothing(owner, first, second):
    assert push(owner, build_wheel("my-env", first)).status_code == 201
    keys = stored_keys()

    response = push(owner, build_wheel("my-env", second))

    assert response.status_code == 409, response.content
    assert response.json()["error"] | {"errors": None} == {
        "type": "conflict_error",
        "code": "invalid_state",
        "message": f"acme/my-env@{first} exists, and {second} is the same version (PEP 440); "
        "versions are immutable: push a new version.",
        "param": "file",
        "errors": None,
    }
    assert rows() == [("my-env", first)]
    assert stored_keys() == keys
    assert owner.client().get("/api/v1/environments/acme/my-env@latest").json()["version"] == first


def test_an_equal_version_of_a_deleted_one_is_never_reused(owner):
    assert push(owner, build_wheel("my-env", "0.1.0")).status_code == 201
    assert owner.client().delete("/api/v1/environments/acme/my-env@0.1.0").status_code == 204

    response = push(owner, build_wheel("my-env", "0.1"))

    assert response.status_code == 409
    assert response.json()["error"]["message"] == (
        "acme/my-env@0.1.0 was deleted; versions are never reused: push it as a new version."
    )
    assert rows() == [("my-env", "0.1.0")]


def test_other_versions_and_other_names_are_still_pushed(owner, outsider):
    assert push(owner, build_wheel("my-env", "0.1.0")).status_code == 201
    assert push(owner, build_wheel("my-env", "0.1.1")).status_code == 201
    assert push(owner, build_wheel("my-env", "0.1.0.post1")).status_code == 201
    assert push(owner, build_wheel("other-env", "0.1")).status_code == 201
    assert push(outsider, build_wheel("my-env", "0.1")).status_code == 201
    assert push(owner, build_wheel("my-env", "0.1.0")).status_code == 200  # the same bytes again

    assert rows() == [("my-env", "0.1"), ("my-env", "0.1.0"), ("my-env", "0.1.0.post1"), ("my-env", "0.1.1"),
                      ("other-env", "0.1")]


def test_two_equal_versions_pushed_at_once_store_one(owner, monkeypatch):
    """Both pushes pass the first check and store their wheel before either writes its row; the
    second to write sees the first's row and is refused."""
    stored = threading.Barrier(2, timeout=20)
    put_stream = storage.put_stream

    def put_then_wait(*args, **kwargs):
        put_stream(*args, **kwargs)
        stored.wait()

    monkeypatch.setattr(storage, "put_stream", put_then_wait)
    outcomes: dict[str, object] = {}

    def run(version: str) -> None:
        filename, data = build_wheel("my-env", version)
        try:
            _, created = environment_push(
                organization=owner.organization, actor=Actor(user=owner.user), handle=io.BytesIO(data),
                filename=filename, size_bytes=len(data),
            )
            outcomes[version] = created
        except LabError as error:
            outcomes[version] = http_status(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(version,)) for version in ("0.1", "0.1.0")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes.values(), key=str) == [409, True]
    assert len(rows()) == 1


@pytest.mark.parametrize(("wheel", "message"), [
    (build_wheel("\u017fum", "0.1.0"), "the file name names the package '\u017fum'"),
    (build_wheel("caf\u00e9-env", "0.1.0"), "the file name names the package 'caf\u00e9_env'"),
    (build_wheel("kelvin-env", "0.1.0", metadata_name="\u212aelvin-env"), "METADATA names the package '\u212aelvin-env'"),
], ids=["long-s", "e-acute", "kelvin-sign-in-metadata"])
def test_a_package_name_that_is_not_ascii_is_a_400_that_stores_nothing(owner, wheel, message):
    response = push(owner, wheel)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_environment_package", "file")
    assert error["message"] == (
        f"Not an acceptable environment wheel: {message}: a package name is ASCII letters, digits, '-', '_' and '.' (PEP 508)."
    )
    assert rows() == []
    assert stored_keys() == []
